import { Matches } from 'class-validator';

/**
 * Text PostgreSQL stores as sent: no control characters (`\p{Cc}`: NUL is refused by PostgreSQL
 * with "invalid byte sequence", the others are never meant in an identifier) and no unpaired
 * surrogate (`\p{Cs}`: not UTF-8, the driver would store U+FFFD instead).
 */
export const STORABLE_TEXT = /^[^\p{Cc}\p{Cs}]*$/u;

/** `@Matches(STORABLE_TEXT)` with a message that says what to remove. */
export const IsStorableText = () =>
  Matches(STORABLE_TEXT, { message: '$property must not contain control characters (such as NUL) or unpaired surrogates' });

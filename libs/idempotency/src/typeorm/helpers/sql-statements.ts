/** What a statement asked of a runner does to its transaction, statement by statement, comments left out. */
export type TransactionStep = 'start' | 'commit' | 'rollback' | 'chain-commit' | 'chain-rollback';

const ENDS = /^(?:(rollback|abort)|commit|end)(?:\s+(?:work|transaction|tran))?(?:\s+and\s+(no\s+)?chain)?$/i;
/** `PREPARE TRANSACTION 'gid'`; not a prepared statement named "transaction" (`PREPARE transaction AS ...`). */
const PREPARES = /^prepare\s+transaction\s*(?:[eE]|[uU]&)?'/i;
const STARTS = /^(?:begin(?:\s+(?:work|transaction|tran))?|start\s+transaction)(?:\s+(?:isolation\s+level|read|not|deferrable)\b.*)?$/i;
const MAY_STEP = /\b(?:rollback|abort|commit|end|prepare|begin|start)\b/i;

/** The transaction steps of `query` (TypeORM's, or the app's raw SQL), in order. */
export function stepsOf(query: string): TransactionStep[] {
  if (!MAY_STEP.test(query)) return [];
  const steps: TransactionStep[] = [];
  for (const part of statementsOf(query)) {
    const statement = part.trim().replace(/\s+/g, ' ');
    const end = ENDS.exec(statement);
    if (end) {
      const chained = / and chain$/i.test(statement);
      steps.push(end[1] ? (chained ? 'chain-rollback' : 'rollback') : chained ? 'chain-commit' : 'commit');
    } else if (PREPARES.test(statement)) steps.push('rollback');
    else if (STARTS.test(statement)) steps.push('start');
  }
  return steps;
}

/** PostgreSQL's identifier characters: every byte past ASCII is one. */
const IDENTIFIER = /[A-Za-z0-9_$\u0080-\uffff]/;
const WORD_START = /[A-Za-z_\u0080-\uffff]/;
const DOLLAR_TAG = /\$(?:[A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$/y;
const WORD = /[A-Za-z_\u0080-\uffff][A-Za-z0-9_$\u0080-\uffff]*/y;

/**
 * The statements of `query`, split at its semicolons as PostgreSQL reads them: not inside quoted
 * text (`'...'`, `E'...'` with its backslash escapes, `"..."`), dollar-quoted bodies
 * (`$$ ... $$`, `$tag$ ... $tag$`, never started inside an identifier such as `a$b$c`), comments
 * (`-- ...` to a line end, nested `/* ... *\/`), which are left out, nor the SQL-standard body of
 * a function or procedure created (`CREATE ... BEGIN ATOMIC ... END`, whose `END` comes at the
 * start of a statement of the body). Split at every semicolon, a PL/pgSQL block's `END;` was read
 * as the transaction's end and every helper call after it refused; and each of these misread as
 * the bounds of a string hid the app's ROLLBACK after it, so an INSERT committed on its own
 * (adversarial helpers, the last a differential fuzzer against PostgreSQL 15). Not read:
 * `standard_conforming_strings = off` (backslash escapes in every string).
 */
export function statementsOf(query: string): string[] {
  const statements: string[] = [];
  let from = 0;
  let current = '';
  /** Inside a `BEGIN ATOMIC` body. */
  let atomic = false;
  /** The statement's first word, and the word just before (`''` after anything but blanks). */
  let firstWord = '';
  let previousWord = '';
  /** At the start of a statement (of the query, or of an atomic body). */
  let atStart = true;
  for (let i = 0; i < query.length; ) {
    const c = query[i]!;
    const afterIdentifier = i > 0 && IDENTIFIER.test(query[i - 1]!);
    const startsWord = !afterIdentifier && WORD_START.test(c);
    const comment = c === '-' && query[i + 1] === '-' ? 'line' : c === '/' && query[i + 1] === '*' ? 'block' : undefined;
    let skipTo = -1;
    if (c === ';') {
      atStart = true;
      previousWord = '';
      if (atomic) {
        i++;
        continue;
      }
      statements.push(current + query.slice(from, i));
      current = '';
      from = ++i;
      firstWord = '';
      continue;
    }
    // Anything but blanks, comments and words (a string, a number, an operator) parts two words.
    if (!startsWord && !comment && !/\s/.test(c)) {
      atStart = false;
      previousWord = '';
    }
    if (c === "'" || c === '"') {
      const escapes = c === "'" && /[eE]/.test(query[i - 1] ?? '') && !(i > 1 && IDENTIFIER.test(query[i - 2]!));
      i = closingQuote(query, i, c, escapes);
      continue;
    }
    if (comment === 'line') {
      // To a line end: LF or CR (a CR alone ended it: the ROLLBACK after it was missed).
      const newline = query.slice(i).search(/[\n\r]/);
      skipTo = newline < 0 ? query.length : i + newline;
    } else if (comment === 'block') {
      skipTo = blockCommentEnd(query, i);
    } else if (c === '$' && !afterIdentifier) {
      DOLLAR_TAG.lastIndex = i;
      const tag = DOLLAR_TAG.exec(query)?.[0];
      if (tag) {
        const close = query.indexOf(tag, i + tag.length);
        skipTo = close < 0 ? query.length : close + tag.length;
      }
    } else if (startsWord) {
      WORD.lastIndex = i;
      const text = WORD.exec(query)![0];
      const word = text.toUpperCase();
      if (!firstWord) firstWord = word;
      if (!atomic && word === 'ATOMIC' && previousWord === 'BEGIN' && firstWord === 'CREATE') atomic = true;
      else if (atomic && word === 'END' && (atStart || previousWord === 'ATOMIC')) atomic = false;
      previousWord = word;
      atStart = false;
      // By the text's own length: upper-cased, 'ß' is 'SS'.
      i += text.length;
      continue;
    }
    if (skipTo < 0) {
      i++;
      continue;
    }
    current += `${query.slice(from, i)} `;
    i = from = skipTo;
  }
  statements.push(current + query.slice(from));
  return statements;
}

/** Blanks with a line end, then a quote: a string continued (`'a'` newline `'b'` is `'ab'`, in the first's mode). */
const CONTINUED = /[ \t\f]*[\n\r]\s*'/y;

/** Where the quoted text opened at `open` ends (past its closing quote); a doubled quote is one inside it. */
function closingQuote(query: string, open: number, quote: string, backslashEscapes: boolean): number {
  for (let i = open + 1; i < query.length; i++) {
    const c = query[i];
    if (backslashEscapes && c === '\\') i++;
    else if (c === quote) {
      if (query[i + 1] === quote) {
        i++;
        continue;
      }
      CONTINUED.lastIndex = i + 1;
      if (quote !== "'" || !CONTINUED.test(query)) return i + 1;
      i = CONTINUED.lastIndex - 1;
    }
  }
  return query.length;
}

/** Where the block comment opened at `open` ends: PostgreSQL's nest. */
function blockCommentEnd(query: string, open: number): number {
  let depth = 0;
  for (let i = open; i < query.length - 1; i++) {
    if (query[i] === '/' && query[i + 1] === '*') {
      depth++;
      i++;
    } else if (query[i] === '*' && query[i + 1] === '/') {
      depth--;
      i++;
      if (depth === 0) return i + 1;
    }
  }
  return query.length;
}

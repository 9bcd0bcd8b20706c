import type { KeyResolver, NoRepeatSubmitOptions } from '../idempotency.options.js';
import type { KeyPath } from '../keys/key-expression.js';

/** What `@NoRepeatSubmit()` records on a handler or controller, checked when the class loads. */
export interface NoRepeatSubmitMetadata {
  options: NoRepeatSubmitOptions;
  /** Where the key comes from: a parsed expression, a function, or the Idempotency-Key header. */
  key: { path: KeyPath } | { resolve: KeyResolver } | { header: true };
  /** `Controller.method` (or the controller's name on a class), for messages. */
  where: string;
}

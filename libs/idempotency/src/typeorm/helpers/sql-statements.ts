/** What a statement asked of a runner does to its transaction, statement by statement, comments left out. */
export type TransactionStep = 'start' | 'commit' | 'rollback' | 'chain-commit' | 'chain-rollback';

const ENDS = /^(?:(rollback|abort)|commit|end)(?:\s+(?:work|transaction|tran))?(?:\s+and\s+(no\s+)?chain)?$/i;
const PREPARES = /^prepare\s+transaction\b/i;
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

const IDENTIFIER = /[\p{L}\p{N}_$]/u;
const DOLLAR_TAG = /\$(?:[\p{L}_][\p{L}\p{N}_]*)?\$/uy;
const WORD = /[\p{L}_][\p{L}\p{N}_$]*/uy;

/**
 * The statements of `query`, split at its semicolons as PostgreSQL reads them: not inside quoted
 * text (`'...'`, `E'...'` with its backslash escapes, `"..."`), dollar-quoted bodies
 * (`$$ ... $$`, `$tag$ ... $tag$`, never started inside an identifier such as `a$b$c`), comments
 * (`-- ...`, nested `/* ... *\/`), which are left out, nor a SQL-standard function body
 * (`BEGIN ATOMIC ... END`). Split at every semicolon, a PL/pgSQL block's `END;` was read as the
 * transaction's end and every helper call after it refused; and each of these misread as the
 * bounds of a string hid the app's ROLLBACK after it, so an INSERT committed on its own
 * (adversarial helpers).
 */
export function statementsOf(query: string): string[] {
  const statements: string[] = [];
  let from = 0;
  let current = '';
  /** Open `BEGIN ATOMIC` bodies and `CASE` expressions in them: `END` closes one. */
  let atomic = 0;
  let previousWord = '';
  for (let i = 0; i < query.length; ) {
    const c = query[i]!;
    const afterIdentifier = i > 0 && IDENTIFIER.test(query[i - 1]!);
    let skipTo = -1;
    if (c === ';') {
      if (atomic > 0) {
        i++;
        continue;
      }
      statements.push(current + query.slice(from, i));
      current = '';
      from = ++i;
      previousWord = '';
      continue;
    }
    if (c === "'" || c === '"') {
      const escapes = c === "'" && /[eE]/.test(query[i - 1] ?? '') && !(i > 1 && IDENTIFIER.test(query[i - 2]!));
      i = closingQuote(query, i, c, escapes);
      continue;
    }
    if (c === '-' && query[i + 1] === '-') {
      const newline = query.indexOf('\n', i);
      skipTo = newline < 0 ? query.length : newline;
    } else if (c === '/' && query[i + 1] === '*') {
      skipTo = blockCommentEnd(query, i);
    } else if (c === '$' && !afterIdentifier) {
      DOLLAR_TAG.lastIndex = i;
      const tag = DOLLAR_TAG.exec(query)?.[0];
      if (tag) {
        const close = query.indexOf(tag, i + tag.length);
        skipTo = close < 0 ? query.length : close + tag.length;
      }
    } else if (!afterIdentifier && /[\p{L}_]/u.test(c)) {
      WORD.lastIndex = i;
      const word = WORD.exec(query)![0].toUpperCase();
      if (word === 'ATOMIC' && previousWord === 'BEGIN') atomic++;
      else if (atomic > 0 && word === 'CASE') atomic++;
      else if (atomic > 0 && word === 'END') atomic--;
      previousWord = word;
      i += word.length;
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

/** Where the quoted text opened at `open` ends (past its closing quote); a doubled quote is one inside it. */
function closingQuote(query: string, open: number, quote: string, backslashEscapes: boolean): number {
  for (let i = open + 1; i < query.length; i++) {
    const c = query[i];
    if (backslashEscapes && c === '\\') i++;
    else if (c === quote) {
      if (query[i + 1] !== quote) return i + 1;
      i++;
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

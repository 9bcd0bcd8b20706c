import { describe, expect, it } from '@jest/globals';
import { stepsOf } from './sql-statements.js';

describe('stepsOf: the transaction steps of a query, as PostgreSQL splits it', () => {
  it.each([
    ['BEGIN', ['start']],
    ['START TRANSACTION ISOLATION LEVEL SERIALIZABLE', ['start']],
    ['COMMIT', ['commit']],
    ['end transaction', ['commit']],
    ['ROLLBACK AND CHAIN', ['chain-rollback']],
    ['SELECT 1; ROLLBACK', ['rollback']],
    ['ROLLBACK TO SAVEPOINT typeorm_1', []],
    // Text that only mentions an end.
    ["SELECT 'a; commit; b'", []],
    ['SELECT "end; commit" FROM t', []],
    ["SELECT 'end; commit' AS text -- rollback; end", []],
    ['DO $$ BEGIN PERFORM pg_advisory_xact_lock(42); END; $$', []],
    ['DO $body$ BEGIN IF true THEN PERFORM 1; END IF; END; $body$', []],
    ['/* disabled: /* old */ COMMIT; */ SELECT 1', []],
    ['CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END', []],
    ['CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT CASE WHEN true THEN 1 END; END; COMMIT', ['commit']],
    ["SELECT E'\\'; rollback; select \\''", []],
    // helper-204: misread string bounds hid the app's ROLLBACK, and an INSERT committed on its own.
    ["SELECT E'it\\'s'; ROLLBACK", ['rollback']],
    ["SELECT E'\\\\'; ROLLBACK", ['rollback']],
    ["SELECT 'it''s'; ROLLBACK", ['rollback']],
    ['SELECT 1 AS a$b$c; ROLLBACK', ['rollback']],
    ['SELECT $1; ROLLBACK', ['rollback']],
    ['SELECT $1, $2 FROM t WHERE x = $3; COMMIT', ['commit']],
    ['SELECT $tag$ x; commit; $tag$; ROLLBACK', ['rollback']],
    ['SELECT 1 -- a comment\n; ROLLBACK', ['rollback']],
    // helper-205, a differential fuzzer against PostgreSQL 15 (each disagreed before).
    ['SELECT 1; -- note\rROLLBACK', ['rollback']],
    ['COMMIT -- note\rAND CHAIN', ['chain-commit']],
    ['SELECT 1 AS «$$; ROLLBACK; SELECT 1 AS «$$', ['rollback']],
    ['SELECT 1 AS 𝑎$$; ROLLBACK', ['rollback']],
    ['SELECT $€$; COMMIT; $€$', []],
    ['SELECT 1 AS ß;ROLLBACK', ['rollback']],
    ['SELECT 1 AS ﬁ;COMMIT', ['commit']],
    ['SELECT 1 AS ß--; COMMIT', []],
    ['CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 AS end; END', []],
    ['CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 AS case; END; ROLLBACK', ['rollback']],
    ['CREATE PROCEDURE pg_temp.p() LANGUAGE sql BEGIN ATOMIC END; COMMIT', ['commit']],
    ['SELECT 1 end; ROLLBACK', ['rollback']],
    ['SELECT begin atomic FROM (SELECT 1 AS begin) t; ROLLBACK', ['rollback']],
    ["SELECT begin, 'x' atomic FROM (SELECT 1 AS begin) t; ROLLBACK", ['rollback']],
    ['PREPARE transaction AS SELECT 1', []],
    ["PREPARE TRANSACTION 'gid-1'", ['rollback']],
    ["SELECT E'x'\n'\\''; ROLLBACK; SELECT ''", ['rollback']],
    ["SELECT E'x'\n'\\'; COMMIT; SELECT '", []],
    ["SELECT 'x' 'y'; COMMIT", ['commit']],
  ])('%s', (query, steps) => {
    expect(stepsOf(query)).toEqual(steps);
  });
});

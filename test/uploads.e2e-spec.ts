import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { createHash, randomUUID } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { gzipSync } from 'node:zlib';
import { DataSource } from 'typeorm';
import type { HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { listenDemo } from './support/demo-server.js';
import { eventually } from './support/eventually.js';
import { DATABASE_URL } from './support/services.js';

const sha256 = (text: string | Buffer) => createHash('sha256').update(text).digest('hex');
const receipt = (no: string, amount = '12.50') => `<receipt><no>${no}</no><amount>${amount}</amount><note>coffee</note></receipt>`;
const newNo = () => `R-${randomUUID().slice(0, 8)}`;

interface Answer {
  status: number;
  headers: Headers;
  body: Record<string, unknown> & { uploadId?: string; code?: string };
}

/** POST /uploads/xml through fetch: the body is sent byte for byte. */
async function post(baseUrl: string, body: string | Buffer, headers: Record<string, string> = {}): Promise<Answer> {
  const res = await fetch(`${baseUrl}/uploads/xml`, { method: 'POST', headers: { 'content-type': 'application/xml', ...headers }, body });
  return { status: res.status, headers: res.headers, body: (await res.json()) as Answer['body'] };
}

/**
 * POST /uploads/xml without X-User-Id from the loopback address `localAddress`: each address of
 * 127.0.0.0/8 is another anonymous client to the server (`request.ip`).
 */
function postAnonymously(baseUrl: string, localAddress: string, body: string, headers: Record<string, string | string[]> = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${baseUrl}/uploads/xml`, { method: 'POST', localAddress, headers: { 'content-type': 'application/xml', ...headers } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (text += chunk));
      res.on('end', () => {
        const answerHeaders = new Headers();
        for (const [name, value] of Object.entries(res.headers)) if (typeof value === 'string') answerHeaders.set(name, value);
        resolve({ status: res.statusCode!, headers: answerHeaders, body: JSON.parse(text) as Answer['body'] });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

const replayedBy = (answer: Answer) => [answer.headers.get('idempotent-replayed'), answer.headers.get('idempotent-matched-by')];

/**
 * XML receipt uploads, idempotent in two layers (request id, then the SHA-256 of the raw bytes)
 * with outcome records in PostgreSQL. Each test uploads as a user of its own (X-User-Id), so its
 * records are in a scope of their own.
 */
describe.each<HttpAdapterName>(['express', 'fastify'])('POST /uploads/xml (%s)', (adapter) => {
  let app: INestApplication;
  let baseUrl: string;
  let user: string;
  const upload = (body: string | Buffer, headers: Record<string, string> = {}) => post(baseUrl, body, { 'x-user-id': user, ...headers });
  const query = (sql: string, params: unknown[]) => app.get(DataSource).query(sql, params);
  const records = () => query(`select * from idempotency_outcomes where scope = $1`, [`uploads.xml:user:${user}`]);
  const uploads = () => query(`select * from xml_uploads where user_id = $1`, [user]);

  beforeAll(async () => {
    ({ app, baseUrl } = await listenDemo({ adapter, databaseUrl: DATABASE_URL, keyPrefix: `uploads-${randomUUID()}` }));
  });
  beforeEach(() => {
    user = `u-${randomUUID().slice(0, 12)}`;
  });
  afterAll(async () => app?.close());

  it('stores a receipt (201), reads it back, and replays it for the same request id: one record, one upload', async () => {
    const xml = receipt(newNo());
    const first = await upload(xml, { 'x-request-id': 'req-1' });
    expect(first.status).toBe(201);
    expect(first.body).toEqual({
      uploadId: expect.stringMatching(/^[0-9a-f-]{36}$/),
      contentHash: sha256(xml),
      requestId: 'req-1',
      status: 'SUCCESS',
      receipt: { no: expect.stringMatching(/^R-/), amount: 12.5 },
      createdAt: expect.any(String),
    });
    expect(replayedBy(first)).toEqual([null, null]);

    const again = await upload(xml, { 'x-request-id': 'req-1' });
    expect([again.status, again.body]).toEqual([201, first.body]);
    expect(replayedBy(again)).toEqual(['true', 'request-id']);
    // X-Idempotency-Key is the same request id.
    expect((await upload(xml, { 'x-idempotency-key': 'req-1' })).body.uploadId).toBe(first.body.uploadId);

    const read = await fetch(`${baseUrl}/uploads/${first.body.uploadId}`);
    expect([read.status, await read.json()]).toEqual([200, first.body]);
    expect(await records()).toEqual([expect.objectContaining({ state: 'SUCCESS', request_id: 'req-1', content_hash: sha256(xml), attempt: 1 })]);
    expect(await uploads()).toHaveLength(1);
  });

  it('answers the same bytes under another request id, or none, with the first upload (content layer)', async () => {
    const xml = receipt(newNo());
    const first = await upload(xml, { 'x-request-id': 'gateway-1' });
    for (const headers of <Record<string, string>[]>[{ 'x-request-id': 'erp-7' }, {}]) {
      const other = await upload(xml, headers);
      expect([other.status, other.body]).toEqual([201, first.body]);
      expect(replayedBy(other)).toEqual(['true', 'content-hash']);
    }
    expect(await records()).toHaveLength(1);
    expect(await uploads()).toHaveLength(1);
  });

  it('treats the same receipt with other whitespace as a new upload: the raw bytes are the contract', async () => {
    const no = newNo();
    const compact = receipt(no);
    const pretty = `<receipt>\n  <no>${no}</no>\n  <amount>12.50</amount>\n  <note>coffee</note>\n</receipt>\n`;
    const first = await upload(compact, { 'x-request-id': 'a' });
    const second = await upload(pretty, { 'x-request-id': 'b' });
    expect([first.status, second.status]).toEqual([201, 201]);
    expect(second.body.uploadId).not.toBe(first.body.uploadId);
    expect(second.body.contentHash).toBe(sha256(pretty));
    expect(replayedBy(second)).toEqual([null, null]);
    expect(await uploads()).toHaveLength(2);
  });

  it('answers 422 IDEMPOTENCY_KEY_REUSED for a request id that already uploaded other content', async () => {
    await upload(receipt(newNo()), { 'x-request-id': 'once' });
    const reused = await upload(receipt(newNo()), { 'x-request-id': 'once' });
    expect([reused.status, reused.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
    expect(await uploads()).toHaveLength(1);
  });

  // helper-211: the demo read `req.headers`, where Node joins two lines into `r1, r1`: an id of its own.
  it('refuses an X-Request-Id sent on two lines with 400 IDEMPOTENCY_KEY_INVALID, and stores nothing', async () => {
    const answer = await postAnonymously(baseUrl, '127.0.0.1', receipt(newNo()), { 'x-user-id': user, 'x-request-id': ['r1', 'r1'] });
    expect([answer.status, answer.body.code]).toEqual([400, 'IDEMPOTENCY_KEY_INVALID']);
    expect(answer.body.message).toMatch(/more than once/);
    expect(await uploads()).toHaveLength(0);
  });

  it('checks the client digest (X-Content-Hash or If-Match) against the raw bytes, and refuses a mismatch with 400', async () => {
    const xml = receipt(newNo());
    const hex = sha256(xml);
    const sent = await upload(xml, { 'x-request-id': 'd1', 'x-content-hash': hex.toUpperCase() });
    expect([sent.status, sent.body.contentHash]).toEqual([201, hex]);
    const viaIfMatch = await upload(xml, { 'x-request-id': 'd2', 'if-match': `"sha256:${hex}"` });
    expect([viaIfMatch.status, viaIfMatch.body.uploadId]).toEqual([201, sent.body.uploadId]);

    const tampered = `${xml} `;
    const mismatch = await upload(tampered, { 'x-request-id': 'd3', 'x-content-hash': hex });
    expect(mismatch.status).toBe(400);
    expect(mismatch.body).toMatchObject({ code: 'CONTENT_HASH_MISMATCH', contentHash: sha256(tampered), bytes: Buffer.byteLength(tampered) });
    const viaEtag = await upload(tampered, { 'if-match': `"${hex}"` });
    expect([viaEtag.status, viaEtag.body.code]).toEqual([400, 'CONTENT_HASH_MISMATCH']);
    for (const headers of <Record<string, string>[]>[{ 'if-match': `W/"${hex}"` }, { 'if-match': '*' }, { 'x-content-hash': 'md5:abc' }]) {
      const invalid = await upload(xml, headers);
      expect([invalid.status, invalid.body.code]).toEqual([400, 'CONTENT_HASH_INVALID']);
    }
    // Nothing recorded for refused digests: d3 is still free.
    expect((await records()).map((r: { request_id: string }) => r.request_id)).toEqual(['d1']);
  });

  it('refuses a gzip upload 415 CONTENT_HASH_ENCODING_UNSUPPORTED, whichever digest it carries, recording nothing (Express would hash the decoded bytes, Fastify the sent ones)', async () => {
    const xml = receipt(newNo());
    const gzipped = gzipSync(xml);
    for (const digest of [sha256(gzipped), sha256(xml)]) {
      const refused = await upload(gzipped, { 'content-encoding': 'gzip', 'x-content-hash': digest });
      expect([refused.status, refused.body.code, refused.headers.get('accept-encoding')]).toEqual([415, 'CONTENT_HASH_ENCODING_UNSUPPORTED', 'identity']);
    }
    expect(await records()).toEqual([]);
  });

  it('answers malformed XML 400 INVALID_XML, records it FAILED, and lets a corrected retry with the same request id succeed', async () => {
    const no = newNo();
    const broken = `<receipt><no>${no}</no><amount>12.50</amount>`;
    const refused = await upload(broken, { 'x-request-id': 'fix-me' });
    expect([refused.status, refused.body.code]).toEqual([400, 'INVALID_XML']);
    expect(refused.body.message).toMatch(/line 1/);
    expect(await records()).toEqual([expect.objectContaining({ state: 'FAILED', status_code: 400, content_hash: sha256(broken) })]);
    // The same broken bytes again run again (FAILED is not replayed) and fail again.
    expect((await upload(broken, { 'x-request-id': 'fix-me' })).status).toBe(400);

    const fixed = await upload(receipt(no), { 'x-request-id': 'fix-me' });
    expect([fixed.status, fixed.body.requestId, replayedBy(fixed)[0]]).toEqual([201, 'fix-me', null]);
    expect(await records()).toEqual([expect.objectContaining({ state: 'SUCCESS', content_hash: sha256(receipt(no)), attempt: 3 })]);
    expect(await uploads()).toHaveLength(1);
  });

  it.each([
    ['no <no>', 'INVALID_RECEIPT', /<no> is missing/, '<receipt><amount>1.00</amount></receipt>'],
    ['an empty <no>', 'INVALID_RECEIPT', /<no> is missing/, '<receipt><no></no><amount>1.00</amount></receipt>'],
    ['two <no>', 'INVALID_RECEIPT', /<no> must appear once/, '<receipt><no>A</no><no>B</no><amount>1.00</amount></receipt>'],
    ['a bad amount', 'INVALID_RECEIPT', /<amount>/, '<receipt><no>A</no><amount>1,5</amount></receipt>'],
    ['another root element', 'INVALID_RECEIPT', /<order>/, '<order><no>A</no></order>'],
    ['two root elements', 'INVALID_XML', /root/, '<receipt><no>A</no><amount>1</amount></receipt><receipt/>'],
    ['text that is not XML', 'INVALID_XML', /not expected|Start tag/, 'no=R-1&amount=1'],
    ['an empty body', 'INVALID_XML', /Start tag expected/, ''],
    ['Latin-1 bytes', 'INVALID_XML', /UTF-8/, Buffer.from('<receipt><no>A</no><amount>1</amount><note>caf\xe9</note></receipt>', 'latin1')],
    ['another declared encoding', 'INVALID_XML', /UTF-8/, '<?xml version="1.0" encoding="ISO-8859-1"?><receipt><no>A</no><amount>1</amount></receipt>'],
    ['nesting 150 levels deep', 'INVALID_XML', /nested/i, `<receipt><no>A</no><amount>1</amount>${'<x>'.repeat(150)}${'</x>'.repeat(150)}</receipt>`],
    ['an external entity (XXE)', 'INVALID_XML', /DOCTYPE/, '<?xml version="1.0"?><!DOCTYPE r [<!ENTITY xxe SYSTEM "file:///etc/passwd">]><receipt><no>&xxe;</no><amount>1</amount></receipt>'],
    ['entity expansion (billion laughs)', 'INVALID_XML', /DOCTYPE/, `<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]><receipt><no>&lol2;</no><amount>1</amount></receipt>`],
    ['a DOCTYPE without entities', 'INVALID_XML', /DOCTYPE/, '<!DOCTYPE receipt SYSTEM "http://127.0.0.1:9/receipt.dtd"><receipt><no>A</no><amount>1</amount></receipt>'],
  ])('answers %s with 400 %s and stores nothing', async (_what, code, message, body) => {
    const answer = await upload(body, { 'x-request-id': randomUUID() });
    expect([answer.status, answer.body.code]).toEqual([400, code]);
    expect(answer.body.message).toMatch(message);
    expect(await uploads()).toHaveLength(0);
    expect((await records()).map((r: { state: string }) => r.state)).toEqual(['FAILED']);
  });

  it.each([
    ['text/plain', { 'content-type': 'text/plain' }, undefined],
    ['application/json', { 'content-type': 'application/json' }, '{"no":"R-1","amount":1}'],
    ['application/octet-stream with a wrong digest', { 'content-type': 'application/octet-stream', 'x-content-hash': '0'.repeat(64) }, undefined],
  ])('answers 415 UNSUPPORTED_MEDIA_TYPE to %s', async (_what, headers: Record<string, string>, body?: string) => {
    const answer = await upload(body ?? receipt(newNo()), headers);
    expect([answer.status, answer.body.code]).toEqual([415, 'UNSUPPORTED_MEDIA_TYPE']);
  });

  it('accepts text/xml with a charset, and answers a body over 1 MiB 413 PAYLOAD_TOO_LARGE', async () => {
    const ok = await upload(receipt(newNo()), { 'content-type': 'text/xml; charset=utf-8' });
    expect(ok.status).toBe(201);
    const huge = `<receipt><no>${newNo()}</no><amount>1</amount><note>${'x'.repeat(1024 * 1024)}</note></receipt>`;
    const tooLarge = await upload(huge);
    expect([tooLarge.status, tooLarge.body.code]).toEqual([413, 'PAYLOAD_TOO_LARGE']);
  });

  it('answers 400 IDEMPOTENCY_KEY_INVALID when X-Request-Id and X-Idempotency-Key differ, or one is empty', async () => {
    for (const headers of <Record<string, string>[]>[{ 'x-request-id': 'a', 'x-idempotency-key': 'b' }, { 'x-request-id': '' }]) {
      const answer = await upload(receipt(newNo()), headers);
      expect([answer.status, answer.body.code]).toEqual([400, 'IDEMPOTENCY_KEY_INVALID']);
    }
  });

  it('keeps users apart: the same bytes from another user are another upload', async () => {
    const xml = receipt(newNo());
    const mine = await upload(xml, { 'x-request-id': 'r' });
    const theirs = await post(baseUrl, xml, { 'x-user-id': `${user}-other`, 'x-request-id': 'r' });
    expect([theirs.status, replayedBy(theirs)[0]]).toEqual([201, null]);
    expect(theirs.body.uploadId).not.toBe(mine.body.uploadId);
  });

  it('keeps anonymous clients apart by their address: one can neither replay nor block the upload of another', async () => {
    const xml = receipt(newNo());
    const requestId = `anon-${randomUUID()}`;
    const first = await postAnonymously(baseUrl, '127.0.0.2', xml, { 'x-request-id': requestId });
    expect([first.status, replayedBy(first)[0]]).toEqual([201, null]);
    // The same client again: its own upload, replayed.
    const again = await postAnonymously(baseUrl, '127.0.0.2', xml);
    expect([again.status, again.body.uploadId, replayedBy(again)]).toEqual([201, first.body.uploadId, ['true', 'content-hash']]);

    // Another anonymous client: the same bytes are its own upload, and the same request id is free for other bytes.
    const sameBytes = await postAnonymously(baseUrl, '127.0.0.3', xml);
    expect([sameBytes.status, replayedBy(sameBytes)[0]]).toEqual([201, null]);
    expect(sameBytes.body.uploadId).not.toBe(first.body.uploadId);
    const sameRequestId = await postAnonymously(baseUrl, '127.0.0.4', receipt(newNo()), { 'x-request-id': requestId });
    expect([sameRequestId.status, sameRequestId.body.code, replayedBy(sameRequestId)[0]]).toEqual([201, undefined, null]);

    const scopes = await query(`select scope from idempotency_outcomes where request_id = $1 order by scope`, [requestId]);
    expect(scopes).toEqual([{ scope: 'uploads.xml:anonymous:127.0.0.2' }, { scope: 'uploads.xml:anonymous:127.0.0.4' }]);
  });

  it.each([
    ['a root element name of 500,000 characters', 'INVALID_RECEIPT', `<${'r'.repeat(500_000)}><no>A</no></${'r'.repeat(500_000)}>`],
    ['an invalid tag name of 1,000,000 characters', 'INVALID_XML', `<receipt><9${'x'.repeat(1_000_000)}/></receipt>`],
  ])('answers and records a refusal quoting %s in at most 500 characters', async (_what, code, xml) => {
    const refused = await upload(xml, { 'x-request-id': randomUUID() });
    expect([refused.status, refused.body.code]).toEqual([400, code]);
    expect(String(refused.body.message).length).toBeLessThanOrEqual(500);
    const [record] = await records();
    expect(record).toMatchObject({ state: 'FAILED', status_code: 400 });
    const stored = JSON.parse(record.body as string) as { code: string; message: string };
    expect(stored.code).toBe(code);
    expect(stored.message.length).toBeLessThanOrEqual(500);
    expect((record.body as string).length).toBeLessThan(1000);
  });

  it.each([
    ['the same request id', (i: number) => ({ 'x-request-id': 'storm', n: String(i) })],
    ['another request id each', (i: number) => ({ 'x-request-id': `storm-${i}` })],
  ])('turns 20 concurrent identical uploads with %s into one record and one upload', async (_what, headersOf) => {
    const xml = receipt(newNo());
    const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => upload(xml, headersOf(i) as Record<string, string>)));
    const fresh = answers.filter((a) => a.status === 201 && replayedBy(a)[0] === null);
    const replayed = answers.filter((a) => a.status === 201 && replayedBy(a)[0] === 'true');
    const inProgress = answers.filter((a) => a.status === 409 && a.body.code === 'IDEMPOTENCY_IN_PROGRESS');
    expect(fresh).toHaveLength(1);
    expect(fresh.length + replayed.length + inProgress.length).toBe(20);
    for (const a of replayed) expect(a.body).toEqual(fresh[0]!.body);
    for (const a of inProgress) expect(Number(a.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(await records()).toHaveLength(1);
    expect(await uploads()).toHaveLength(1);
  });

  it('forgets an upload after its retention: the same bytes are then a new upload, and the old record is purged', async () => {
    const xml = receipt(newNo());
    const first = await upload(xml, { 'x-request-id': 'old' });
    await query(`update idempotency_outcomes set expires_at = now() - interval '1 ms' where scope = $1`, [`uploads.xml:user:${user}`]);
    const again = await upload(xml, { 'x-request-id': 'old' });
    expect([again.status, replayedBy(again)[0]]).toEqual([201, null]);
    expect(again.body.uploadId).not.toBe(first.body.uploadId);
    expect(await records()).toEqual([expect.objectContaining({ state: 'SUCCESS', attempt: 2 })]);
  });

  it('answers 404 UPLOAD_NOT_FOUND for an unknown upload id', async () => {
    for (const id of [randomUUID(), 'nope']) {
      const res = await fetch(`${baseUrl}/uploads/${id}`);
      expect([res.status, ((await res.json()) as { code: string }).code]).toEqual([404, 'UPLOAD_NOT_FOUND']);
    }
  });
});

/** Gates a test opens and closes around the processing of one upload (by its content hash). */
class Gates {
  private readonly gates = new Map<string, { reached: () => void; release: Promise<void> }>();

  /** Holds the first attempt of `contentHash` before it stores anything; returns when it got there, and the opener. */
  hold(contentHash: string): { reached: Promise<void>; open: () => void } {
    let reached!: () => void;
    let open!: () => void;
    const reachedPromise = new Promise<void>((resolve) => (reached = resolve));
    const release = new Promise<void>((resolve) => (open = resolve));
    this.gates.set(contentHash, { reached, release });
    return { reached: reachedPromise, open };
  }

  readonly beforeStore = async ({ contentHash, attempt }: { contentHash: string; attempt: number }) => {
    const gate = this.gates.get(contentHash);
    if (!gate || attempt !== 1) return;
    gate.reached();
    await gate.release;
  };
}

describe.each<HttpAdapterName>(['express', 'fastify'])('XML uploads with a short lease and a small body limit (%s)', (adapter) => {
  let app: INestApplication;
  let baseUrl: string;
  let user: string;
  const gates = new Gates();
  const upload = (body: string, headers: Record<string, string> = {}) => post(baseUrl, body, { 'x-user-id': user, ...headers });
  const scope = () => `uploads.xml:user:${user}`;
  const query = (sql: string, params: unknown[]) => app.get(DataSource).query(sql, params);
  const leaseOver = async () => (await query(`select expires_at <= now() as over from idempotency_outcomes where scope = $1`, [scope()]))[0]?.over === true;

  beforeAll(async () => {
    ({ app, baseUrl } = await listenDemo({
      adapter,
      databaseUrl: DATABASE_URL,
      keyPrefix: `uploads-lease-${randomUUID()}`,
      // 2 s: the duplicate below must meet the hold on a loaded machine; the tests wait for its end.
      uploads: { leaseMs: 2000, bodyLimitBytes: 1024, faults: { beforeStore: gates.beforeStore } },
    }));
  });
  beforeEach(() => {
    user = `u-${randomUUID().slice(0, 12)}`;
  });
  afterAll(async () => app?.close());

  it('takes over a PROCESSING upload whose lease ran out, and refuses the stale original its late completion', async () => {
    const xml = receipt(newNo());
    const gate = gates.hold(sha256(xml));
    const original = upload(xml, { 'x-request-id': 'slow' });
    await gate.reached;
    expect((await upload(xml, { 'x-request-id': 'slow' })).body.code).toBe('IDEMPOTENCY_IN_PROGRESS');
    await eventually(leaseOver);

    const takeover = await upload(xml, { 'x-request-id': 'slow' });
    expect([takeover.status, replayedBy(takeover)[0]]).toEqual([201, null]);
    gate.open();
    const late = await original;
    expect([late.status, late.body.code, late.headers.get('retry-after')]).toEqual([409, 'UPLOAD_SUPERSEDED', '1']);

    const retry = await upload(xml, { 'x-request-id': 'slow' });
    expect([retry.status, retry.body]).toEqual([201, takeover.body]);
    expect(await query(`select state, attempt from idempotency_outcomes where scope = $1`, [scope()])).toEqual([{ state: 'SUCCESS', attempt: 2 }]);
    expect(await query(`select id from xml_uploads where user_id = $1`, [user])).toEqual([{ id: takeover.body.uploadId }]);
  });

  it('lets a late original complete when nobody took its upload over (its token still holds the record)', async () => {
    const xml = receipt(newNo());
    const gate = gates.hold(sha256(xml));
    const original = upload(xml, { 'x-request-id': 'late' });
    await gate.reached;
    await eventually(leaseOver);
    gate.open();
    const late = await original;
    expect(late.status).toBe(201);
    expect((await upload(xml, { 'x-request-id': 'late' })).body).toEqual(late.body);
  });

  it('answers a body over the configured limit (1 KiB here) 413 PAYLOAD_TOO_LARGE', async () => {
    const big = await upload(receipt(newNo(), '1.00').replace('coffee', 'x'.repeat(2048)));
    expect([big.status, big.body.code]).toEqual([413, 'PAYLOAD_TOO_LARGE']);
    expect((await upload(receipt(newNo()))).status).toBe(201);
  });
});

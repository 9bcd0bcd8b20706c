import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { BadRequestException, Body, Controller, Headers, Injectable, Module, Post, Res, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ClientProxyFactory, MessagePattern, Payload, RpcException, Transport, type ClientProxy, type RedisOptions } from '@nestjs/microservices';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { TypeOrmModule } from '@nestjs/typeorm';
import { randomUUID } from 'node:crypto';
import { firstValueFrom } from 'rxjs';
import request from 'supertest';
import { Column, DataSource, Entity, PrimaryGeneratedColumn } from 'typeorm';
import { IdempotencyErrorCode, REPLAYED_HEADER, sha256Hex } from '../libs/idempotency/src/index.js';
import {
  IDEMPOTENCY_MIGRATIONS,
  IdempotentTransactions,
  answerHttp,
  type HttpReply,
  provideIdempotentTransactions,
  type IdempotentRunResult,
} from '../libs/idempotency/src/typeorm/index.js';
import { DATABASE_URL, REDIS_URL } from './support/services.js';
import { createTestSchema, dropTestSchema, testSchemaName } from './support/test-schema.js';

/** The business effect; deliberately without a unique key, so that a second run shows. */
@Entity({ name: 'captures' })
class Capture {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ name: 'op_key', type: 'varchar', length: 255 })
  opKey!: string;

  @Column({ type: 'integer' })
  amount!: number;
}

interface CaptureBody {
  captureId: number;
  amount: number;
}

/** Holds the works that start while it is held, so that a duplicate arrives mid-transaction. */
@Injectable()
class Hold {
  private gate: Promise<void> = Promise.resolve();
  private open = () => undefined as void;
  entered = Promise.resolve();
  private enter = () => undefined as void;

  hold(): void {
    this.gate = new Promise((resolve) => (this.open = resolve));
    this.entered = new Promise((resolve) => (this.enter = resolve));
  }

  async pass(): Promise<void> {
    this.enter();
    await this.gate;
  }

  release(): void {
    this.open();
    this.gate = Promise.resolve();
  }
}

/** What both entrances share: one capture per key, its row and its answer in one transaction. */
@Injectable()
class CapturesService {
  constructor(
    private readonly transactions: IdempotentTransactions,
    private readonly hold: Hold,
  ) {}

  capture(key: string, amount: number): Promise<IdempotentRunResult<CaptureBody>> {
    return this.transactions.run({ key, fingerprint: sha256Hex(Buffer.from(JSON.stringify({ amount }))) }, async (manager) => {
      const { id } = await manager.save(Capture, { opKey: key, amount });
      await this.hold.pass();
      // The row is written: a refusal now must take it back (the transaction rolls back).
      if (amount <= 0) throw new BadRequestException('amount must be positive');
      return { statusCode: 201, body: { captureId: id, amount } };
    });
  }
}

@Controller('captures')
class CapturesController {
  constructor(private readonly captures: CapturesService) {}

  @Post()
  async create(@Headers('idempotency-key') key: string | undefined, @Body() body: { amount: number }, @Res({ passthrough: true }) reply: HttpReply) {
    if (!key) throw new BadRequestException({ code: IdempotencyErrorCode.KEY_MISSING });
    const result = await this.captures.capture(`captures:http:${key}`, body.amount);
    return answerHttp(result, reply);
  }
}

const CAPTURE_PATTERN = `captures.capture.${randomUUID()}`;

@Controller()
class CapturesConsumer {
  constructor(private readonly captures: CapturesService) {}

  @MessagePattern(CAPTURE_PATTERN)
  async capture(@Payload() message: { messageId: string; amount: number }): Promise<CaptureBody> {
    const result = await this.captures.capture(`captures:message:${message.messageId}`, message.amount);
    if (result.status === 'ran' || result.status === 'replayed') return result.body;
    throw new RpcException({ code: result.status === 'mismatch' ? IdempotencyErrorCode.KEY_REUSED : IdempotencyErrorCode.IN_PROGRESS });
  }
}

const { hostname: host, port } = new URL(REDIS_URL);
const transport: RedisOptions = { transport: Transport.REDIS, options: { host, port: Number(port) } };

describe.each(['express', 'fastify'] as const)('IdempotentTransactions in a Nest app (%s): a controller and a message consumer', (adapter) => {
  const schema = testSchemaName();
  let app: INestApplication;
  let client: ClientProxy;
  let dataSource: DataSource;
  let hold: Hold;
  const captures = async (opKey: string) => dataSource.getRepository(Capture).countBy({ opKey });
  const post = (key: string, amount: number) => request(app.getHttpServer()).post('/captures').set('idempotency-key', key).send({ amount });

  beforeAll(async () => {
    await createTestSchema(schema);
    @Module({
      imports: [
        TypeOrmModule.forRoot({
          type: 'postgres',
          url: DATABASE_URL,
          schema,
          entities: [Capture],
          synchronize: true, // the business table; the records' table comes from the migrations
          migrations: IDEMPOTENCY_MIGRATIONS,
          migrationsRun: true,
          retryAttempts: 0,
        }),
      ],
      controllers: [CapturesController, CapturesConsumer],
      providers: [provideIdempotentTransactions({ lockTimeoutMs: 1000 }), CapturesService, Hold],
    })
    class CapturesModule {}
    app = await NestFactory.create(CapturesModule, adapter === 'fastify' ? new FastifyAdapter() : new ExpressAdapter(), { logger: ['error'] });
    app.connectMicroservice(transport);
    await app.startAllMicroservices();
    await app.init();
    if (adapter === 'fastify') await (app.getHttpAdapter().getInstance() as { ready(): Promise<void> }).ready();
    dataSource = app.get(DataSource);
    hold = app.get(Hold);
    client = ClientProxyFactory.create(transport);
    await client.connect();
  });
  afterAll(async () => {
    await client?.close();
    await app?.close();
    await dropTestSchema(schema);
  });

  it('injects one provider on the DataSource of TypeOrmModule', () => {
    expect(app.get(IdempotentTransactions).dataSource).toBe(dataSource);
    expect(app.get(IdempotentTransactions).lockTimeoutMs).toBe(1000);
  });

  describe('from a controller', () => {
    it('answers a retry with the saved answer, marked replayed, without a second capture', async () => {
      const key = randomUUID();
      const first = await post(key, 5);
      expect(first.status).toBe(201);
      const retry = await post(key, 5);
      expect(retry.status).toBe(201);
      expect(retry.headers[REPLAYED_HEADER.toLowerCase()]).toBe('true');
      expect(retry.body).toEqual(first.body);
      expect(await captures(`captures:http:${key}`)).toBe(1);
    });

    it('captures once for 10 concurrent duplicates; every one gets the answer', async () => {
      const key = randomUUID();
      const answers = await Promise.all(Array.from({ length: 10 }, () => post(key, 7)));
      expect(answers.map((answer) => answer.status)).toEqual(Array(10).fill(201));
      expect(new Set(answers.map((answer) => JSON.stringify(answer.body))).size).toBe(1);
      expect(await captures(`captures:http:${key}`)).toBe(1);
    });

    it('answers 409 with Retry-After while the first holds the key past lockTimeoutMs, then replays', async () => {
      const key = randomUUID();
      hold.hold();
      const first = post(key, 9).then((answer) => answer);
      await hold.entered;
      const duplicate = await post(key, 9);
      expect(duplicate.status).toBe(409);
      expect(duplicate.headers['retry-after']).toBe('1');
      expect(duplicate.body).toEqual(expect.objectContaining({ statusCode: 409, code: IdempotencyErrorCode.IN_PROGRESS }));
      hold.release();
      expect((await first).status).toBe(201);
      expect((await post(key, 9)).headers[REPLAYED_HEADER.toLowerCase()]).toBe('true');
    });

    it('answers 422 to the key with another body', async () => {
      const key = randomUUID();
      await post(key, 1);
      expect((await post(key, 2)).status).toBe(422);
    });

    it('keeps nothing of a refused capture: the key stays free and the retry captures once', async () => {
      const key = randomUUID();
      expect((await post(key, -1)).status).toBe(400);
      expect(await captures(`captures:http:${key}`)).toBe(0);
      expect((await post(key, 3)).status).toBe(201);
      expect(await captures(`captures:http:${key}`)).toBe(1);
    });
  });

  describe('from a message consumer (Redis transport)', () => {
    const send = (messageId: string, amount: number) => firstValueFrom(client.send<CaptureBody>(CAPTURE_PATTERN, { messageId, amount }));

    it('captures once for 10 concurrent deliveries of one message; every reply is the answer', async () => {
      const messageId = randomUUID();
      const replies = await Promise.all(Array.from({ length: 10 }, () => send(messageId, 4)));
      expect(new Set(replies.map((reply) => JSON.stringify(reply))).size).toBe(1);
      expect(replies[0]).toEqual({ captureId: expect.any(Number), amount: 4 });
      expect(await captures(`captures:message:${messageId}`)).toBe(1);
    });

    it('keeps nothing of a failed delivery, so the redelivery captures once', async () => {
      const messageId = randomUUID();
      await expect(send(messageId, 0)).rejects.toBeDefined();
      expect(await captures(`captures:message:${messageId}`)).toBe(0);
      const redelivered = await send(messageId, 6);
      expect(await send(messageId, 6)).toEqual(redelivered);
      expect(await captures(`captures:message:${messageId}`)).toBe(1);
    });
  });
});

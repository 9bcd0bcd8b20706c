import { Body, Controller, Get, HttpCode, Injectable, Post, type Type } from '@nestjs/common';
import { setTimeout as sleep } from 'node:timers/promises';

/** Handler runs in this process: the business effects a guard is there to count. */
@Injectable()
export class HandlerRuns {
  orders = 0;
  storms = 0;
  crashes = 0;
  /** Commands the guard's Redis client sent (guard arms only; see `countRedisCommands`). */
  redisCommands?: number;
}

interface OrderInput {
  orderNo?: string;
  amount?: number;
}

/** How long the storm handler works, so duplicates arrive while the first one runs. */
export const STORM_HANDLER_MS = 20;

/**
 * The same three endpoints in every arm; only `guard` (the arm's method decorator) differs.
 * - `POST /orders`: the measured endpoint, no I/O (what the guard costs, not a database);
 * - `POST /storm`: works 20 ms, for the storm phase;
 * - `POST /crash`: never answers (the crash phase kills the process mid-request).
 * `GET /bench/stats` is unguarded and tells the driver the handler runs and the process's CPU time.
 */
export function ordersController(guard: MethodDecorator, crashGuard: MethodDecorator = guard): Type {
  @Controller()
  class OrdersController {
    constructor(private readonly runs: HandlerRuns) {}

    @Post('orders')
    @HttpCode(201)
    @guard
    create(@Body() input: OrderInput) {
      const id = ++this.runs.orders;
      return { id, orderNo: input.orderNo, amount: input.amount, status: 'PENDING' };
    }

    @Post('storm')
    @HttpCode(201)
    @guard
    async storm(@Body() input: OrderInput) {
      const id = ++this.runs.storms;
      await sleep(STORM_HANDLER_MS);
      return { id, orderNo: input.orderNo, status: 'PENDING' };
    }

    @Post('crash')
    @HttpCode(201)
    @crashGuard
    async crash(@Body() input: OrderInput) {
      const id = ++this.runs.crashes;
      // Long enough to be killed mid-request; a retry that gets through answers at once.
      if (id === 1 && process.env.CRASH_VICTIM === '1') await sleep(60_000);
      return { id, orderNo: input.orderNo, status: 'PENDING' };
    }

    @Get('bench/stats')
    stats() {
      const cpu = process.cpuUsage();
      return { pid: process.pid, cpuMicros: cpu.user + cpu.system, ...this.runs };
    }
  }
  return OrdersController;
}

/** The decorator of the bare arm. */
export const unguarded: MethodDecorator = () => undefined;

import { Body, Controller, Get, Param, Post, Res, UseGuards } from '@nestjs/common';
import { createdOrExisting, type StatusSetter } from '../http-response.js';
import { JsonBodyGuard } from '../json-body.guard.js';
import { CreateInvoiceDto } from './create-invoice.dto.js';
import { IdempotencyToken } from './idempotency-token.decorator.js';
import type { InvoiceView } from './invoice.view.js';
import { InvoicesService } from './invoices.service.js';

/**
 * Invoices are idempotent through the database alone, with no `@NoRepeatSubmit()` in front:
 * the client's `X-Idempotency-Token` is a unique column of the invoice it creates.
 */
@Controller('invoices')
@UseGuards(JsonBodyGuard)
export class InvoicesController {
  constructor(private readonly invoices: InvoicesService) {}

  /** 201 with a new invoice; 200 with the same invoice for a retry with the same token. */
  @Post()
  async create(
    @Body() dto: CreateInvoiceDto,
    @IdempotencyToken() token: string,
    @Res({ passthrough: true }) res: StatusSetter,
  ): Promise<InvoiceView> {
    const { created, invoice } = await this.invoices.create(dto, token);
    createdOrExisting(res, created);
    return invoice;
  }

  @Get(':id')
  findOne(@Param('id') id: string): Promise<InvoiceView> {
    return this.invoices.findById(id);
  }
}

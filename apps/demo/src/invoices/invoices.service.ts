import { Injectable } from '@nestjs/common';
import { InjectRepository } from '@nestjs/typeorm';
import type { Repository } from 'typeorm';
import { insertOnce } from 'nestjs-idempotency/typeorm';
import type { CreateInvoiceDto } from './create-invoice.dto.js';
import { Invoice, UQ_INVOICES_TERMINAL_NUMBER } from './invoice.entity.js';
import { toInvoiceView, type InvoiceView } from './invoice.view.js';
import { invoiceNotFound, invoiceNumberExists, tokenReused } from './invoices.exceptions.js';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

const sameInvoice = (invoice: Invoice, dto: CreateInvoiceDto): boolean =>
  invoice.terminalId === dto.terminalId && invoice.number === dto.number && invoice.amount === dto.amount;

@Injectable()
export class InvoicesService {
  constructor(@InjectRepository(Invoice) private readonly invoices: Repository<Invoice>) {}

  /**
   * Idempotent by the database alone (no guard in front): one plain INSERT, and on a unique
   * violation the row that holds the violated constraint decides the answer.
   * - no row: created;
   * - a row with this token and the same data: the earlier answer (a retry);
   * - a row with this token and other data: 422 `IDEMPOTENCY_TOKEN_REUSED`;
   * - a row with another token and this (terminal, number): 409 `INVOICE_NUMBER_EXISTS`.
   * A retry violates both unique indexes; PostgreSQL reports whichever it checks first, so the
   * answer is decided by the token of the row found, not by the constraint's name.
   */
  async create(dto: CreateInvoiceDto, token: string): Promise<{ created: boolean; invoice: InvoiceView }> {
    const { terminalId, number, amount } = dto;
    const result = await insertOnce(this.invoices, { idempotencyToken: token, terminalId, number, amount }, (violation) =>
      violation.constraint === UQ_INVOICES_TERMINAL_NUMBER ? { terminalId, number } : { idempotencyToken: token },
    );
    const invoice = result.entity;
    if (!result.created) {
      if (invoice.idempotencyToken !== token) throw invoiceNumberExists();
      if (!sameInvoice(invoice, dto)) throw tokenReused();
    }
    return { created: result.created, invoice: toInvoiceView(invoice) };
  }

  async findById(id: string): Promise<InvoiceView> {
    // Not a UUID: no such invoice (and no query that PostgreSQL would reject with an error).
    const invoice = UUID.test(id) ? await this.invoices.findOneBy({ id }) : null;
    if (!invoice) throw invoiceNotFound();
    return toInvoiceView(invoice);
  }
}

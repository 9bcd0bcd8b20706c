import type { Invoice } from './invoice.entity.js';

/** What the API answers for an invoice. The idempotency token is not echoed. */
export interface InvoiceView {
  id: string;
  terminalId: string;
  number: string;
  amount: number;
  createdAt: Date;
}

export const toInvoiceView = (invoice: Invoice): InvoiceView => ({
  id: invoice.id,
  terminalId: invoice.terminalId,
  number: invoice.number,
  amount: invoice.amount,
  createdAt: invoice.createdAt,
});

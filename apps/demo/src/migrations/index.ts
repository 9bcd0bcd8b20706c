import { DemoInvoices1795996800001 } from './1795996800001-demo-invoices.js';
import { DemoOrders1795996800000 } from './1795996800000-demo-orders.js';
import { DemoXmlUploads1796083200000 } from './1796083200000-demo-xml-uploads.js';
import { DemoPayments1796169600000 } from './1796169600000-demo-payments.js';

/** The demo's migrations, run after the library's (`IDEMPOTENCY_MIGRATIONS`) at start-up. */
export const DEMO_MIGRATIONS = [DemoOrders1795996800000, DemoInvoices1795996800001, DemoXmlUploads1796083200000, DemoPayments1796169600000];

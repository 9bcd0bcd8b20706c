import { XMLParser, XMLValidator } from 'fast-xml-parser';
import { invalidReceipt, invalidXml } from './uploads.exceptions.js';

/** A receipt as the upload endpoint reads it. */
export interface Receipt {
  no: string;
  amount: number;
}

const RECEIPT_NO = /^[A-Za-z0-9_.:\/-]{1,64}$/;
const AMOUNT = /^\d{1,10}(\.\d{1,2})?$/;
const MAX_AMOUNT = 1e9;
/** DOCTYPE (and with it entity declarations) anywhere, even inside a comment or CDATA: refused. */
const DECLARATIONS = /<!\s*(DOCTYPE|ENTITY)/i;
const DECLARED_ENCODING = /^<\?xml[^>]*?\sencoding\s*=\s*["']([^"']*)["']/;

/**
 * Entities are never expanded (`processEntities: false`; documents with a DOCTYPE are refused
 * before parsing anyway), values stay strings (`parseTagValue: false`: "007" is not 7), nesting
 * stops at 100 levels (the parser's `maxNestedTags`).
 */
const parser = new XMLParser({
  processEntities: false,
  htmlEntities: false,
  parseTagValue: false,
  ignoreAttributes: true,
  ignoreDeclaration: true,
  ignorePiTags: true,
  trimValues: true,
});
const utf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * Reads a receipt from the raw bytes of an upload: UTF-8, well-formed (`XMLValidator`), one
 * root element, no DOCTYPE or ENTITY declaration (no entity expansion, no external entities),
 * `<receipt>` with `<no>` (1 to 64 letters, digits or `_ . : / -`) and `<amount>` (a decimal
 * over 0 with at most 2 places, up to 1,000,000,000). Other elements are ignored.
 * Throws 400 `INVALID_XML` for a document that is not acceptable XML, 400 `INVALID_RECEIPT` for
 * acceptable XML that is not such a receipt.
 */
export function parseReceipt(raw: Uint8Array): Receipt {
  let text: string;
  try {
    text = utf8.decode(raw);
  } catch {
    throw invalidXml('it is not UTF-8 text');
  }
  if (DECLARATIONS.test(text)) throw invalidXml('DOCTYPE and ENTITY declarations are not accepted');
  const encoding = DECLARED_ENCODING.exec(text)?.[1];
  if (encoding !== undefined && !/^utf-?8$/i.test(encoding)) throw invalidXml(`it declares encoding "${encoding}"; only UTF-8 is accepted`);
  const valid = XMLValidator.validate(text);
  if (valid !== true) {
    const { msg, line, col } = valid.err;
    throw invalidXml(`${msg.replace(/\.$/, '')} (line ${line}${col === undefined ? '' : `, column ${col}`})`);
  }
  let document: Record<string, unknown>;
  try {
    document = parser.parse(text) as Record<string, unknown>;
  } catch (error) {
    throw invalidXml((error as Error).message.replace(/\.$/, ''));
  }
  const roots = Object.keys(document);
  if (roots.length !== 1 || Array.isArray(document[roots[0]!])) throw invalidXml('it must have exactly one root element');
  if (roots[0] !== 'receipt') throw invalidReceipt(`the root element is <${roots[0]}>, not <receipt>`);
  const receipt = document.receipt;
  const fields = typeof receipt === 'object' && receipt !== null ? (receipt as Record<string, unknown>) : {};
  return { no: receiptNo(fields.no), amount: amount(fields.amount) };
}

function receiptNo(value: unknown): string {
  if (value === undefined || value === '') throw invalidReceipt('<no> is missing');
  if (typeof value !== 'string' || !RECEIPT_NO.test(value)) {
    throw invalidReceipt('<no> must appear once, as 1 to 64 letters, digits or _ . : / -');
  }
  return value;
}

function amount(value: unknown): number {
  if (value === undefined || value === '') throw invalidReceipt('<amount> is missing');
  const number = typeof value === 'string' && AMOUNT.test(value) ? Number(value) : NaN;
  if (!(number > 0 && number <= MAX_AMOUNT)) {
    throw invalidReceipt('<amount> must appear once, as a decimal over 0 with at most 2 places, up to 1000000000');
  }
  return number;
}

/** The characters of an orderNo: letters, digits and `_ . : -`. */
export const ORDER_NO_CHARACTERS = /^[A-Za-z0-9_.:-]+$/;
/** An orderNo's longest length: the width of `orders.order_no`. */
export const ORDER_NO_MAX_LENGTH = 64;
/**
 * The two orderNos of those characters no URL path can hold: a client resolves a `.` or `..`
 * path segment before sending (`/orders/..` goes out as `/`), so `GET /orders/:orderNo` and the
 * admin routes could never reach such an order. Refused when an order is created.
 */
export const DOT_SEGMENTS = ['.', '..'];
/** A whole orderNo: 1 to {@link ORDER_NO_MAX_LENGTH} of {@link ORDER_NO_CHARACTERS}, not one of {@link DOT_SEGMENTS}. */
export const ORDER_NO = new RegExp(`^(?!\\.{1,2}$)[A-Za-z0-9_.:-]{1,${ORDER_NO_MAX_LENGTH}}$`);

export const ORDER_NO_MESSAGE = `orderNo must be 1 to ${ORDER_NO_MAX_LENGTH} letters, digits, "_", ".", ":" or "-", and not "." or ".."`;
/** Why {@link DOT_SEGMENTS} are refused, in the body's validation messages. */
export const DOT_SEGMENT_MESSAGE = 'orderNo must not be "." or "..": no URL path can hold them';

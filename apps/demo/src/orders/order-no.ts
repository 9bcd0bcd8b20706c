/** The characters of an orderNo: letters, digits and `_ . : -`. */
export const ORDER_NO_CHARACTERS = /^[A-Za-z0-9_.:-]+$/;
/** An orderNo's longest length: the width of `orders.order_no`. */
export const ORDER_NO_MAX_LENGTH = 64;
/** A whole orderNo: 1 to {@link ORDER_NO_MAX_LENGTH} of {@link ORDER_NO_CHARACTERS}. */
export const ORDER_NO = new RegExp(`^[A-Za-z0-9_.:-]{1,${ORDER_NO_MAX_LENGTH}}$`);

export const ORDER_NO_MESSAGE = `orderNo must be 1 to ${ORDER_NO_MAX_LENGTH} letters, digits, "_", ".", ":" or "-"`;

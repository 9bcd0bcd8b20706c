/**
 * The part of an Express response or a Fastify reply a handler needs with
 * `@Res({ passthrough: true })`: setting the status while Nest still sends the returned value
 * (and the idempotency guard still sees it, as `res.statusCode`, when it saves the answer).
 */
export interface StatusSetter {
  status(code: number): unknown;
}

/** 201 for a row this request created, 200 for one that existed (a retry that got past the guard). */
export const createdOrExisting = (res: StatusSetter, created: boolean): void => {
  res.status(created ? 201 : 200);
};

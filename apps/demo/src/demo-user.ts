/** The user the demo attaches to `request.user` (see `DemoUserGuard`). */
export interface DemoUser {
  id: string;
}

/** A request as the demo sees it, on Express and Fastify alike. */
export interface DemoRequest {
  headers: Record<string, string | string[] | undefined>;
  user?: DemoUser;
}

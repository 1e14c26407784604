export { SoulClient, Soul, newIdempotencyKey, parseRetryAfter } from "./client.js";
export type {
  CallOptions, ClientOptions, ContextOptions, EpisodesOptions, ForgetWhereOptions, ObserveOptions, RecallOptions,
  RetryOptions, TurnOptions, WriteOptions,
} from "./client.js";
export * from "./errors.js";
export type * from "./api.js";
export type { components, paths } from "./openapi.js";

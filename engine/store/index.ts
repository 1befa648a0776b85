// The store: the port (typed repositories, the tenant id on every method), the records it keeps, and
// the adapter chosen at start (SQLite embedded, MongoDB in production). The only code that imports
// better-sqlite3 or mongoose.
export * from './open.js';
export * from './port.js';
export * from './members.js';

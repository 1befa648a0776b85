// The error of a step that failed for a reason the caller can act on: a module of its own, so that what
// tools use (the sandbox) can throw it without importing the tools.

/** A step that failed for a reason the caller can act on; `code` is stable. */
export class ToolError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = 'ToolError';
  }
}

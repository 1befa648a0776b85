// An automation's runs as its history lists them, for the trigger tests.
import { eventually, type Harness } from './harness.js';

type Body = Record<string, any>;

/** The automation's runs, newest first (up to 100). */
export async function history(h: Harness, id: string): Promise<Body[]> {
  return (await h.call<Body>('GET', `/api/v1/automations/${id}/history?limit=100`)).body.data;
}
/** The automation's runs, once there are at least `n` of them. */
export function runsOnce(h: Harness, id: string, n: number, what: string): Promise<Body[]> {
  return eventually(async () => {
    const r = await history(h, id);
    return r.length >= n ? r : null;
  }, what);
}

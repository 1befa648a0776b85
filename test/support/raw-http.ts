// HTTP spoken by hand, for what a client library would not send: a head alone, a body cut short or sent
// slowly, a request after a pause on the same connection.
import net from 'node:net';

/**
 * What a server answers on a connection of its own to `parts`, each written as it is after its wait (ms),
 * until the server closes the connection, or until `limitMs` has passed (the connection is then closed, and
 * what came is the answer). `ms` is the time from the connection to its close.
 */
export function rawExchange(url: string, parts: [number, string][], limitMs = 6000): Promise<{ text: string; ms: number }> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const socket = net.connect(Number(new URL(url).port), '127.0.0.1', async () => {
      for (const [wait, part] of parts) {
        if (wait) await new Promise((r) => setTimeout(r, wait));
        if (socket.destroyed) return;
        socket.write(part);
      }
    });
    let text = '';
    const timer = setTimeout(() => socket.destroy(), limitMs);
    socket.on('data', (d) => (text += d));
    socket.on('close', () => {
      clearTimeout(timer);
      resolve({ text, ms: performance.now() - started });
    });
    socket.on('error', reject);
  });
}

/** The JSON body of a raw HTTP answer. */
export const bodyOfAnswer = (answer: string) => JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4) || 'null');

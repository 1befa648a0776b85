// spawnSync's answer without blocking the event loop: a test whose service runs in its own process lets it
// go on (its workers, its timers) while a child runs, as a deployed service would (the gates CLI test's
// children ran for up to a minute with the service stopped).
import { spawn, type SpawnOptions } from 'node:child_process';

export type Spawned = { status: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string };

export function spawnAsync(command: string, args: string[], opts: Omit<SpawnOptions, 'stdio'> = {}): Promise<Spawned> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { ...opts, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout!.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', reject);
    child.on('close', (status, signal) => resolve({ status, signal, stdout, stderr }));
  });
}

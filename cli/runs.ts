// `run`, `runs get|watch|cancel|list`: start a budgeted run, follow its events (step starts, output
// lines in order, finishes with timings) and end with the exit code of its status.
import readline from 'node:readline/promises';
import { type ApiClient, CliError, EXIT, type ServiceEvent } from './client.js';
import { type Output, seconds, terminalSafe, visible } from './output.js';

type Run = {
  id: string;
  session_id: string;
  kind: string;
  status: string;
  duration_ms?: number | null;
  summary?: string | null;
  error?: { code: string; message: string } | null;
  created_at?: string;
  automation_id?: string | null;
};

const FINAL: Record<string, number> = { succeeded: EXIT.succeeded, failed: EXIT.failed, timed_out: EXIT.timedOut, canceled: EXIT.canceled };

/** The exit code of a finished run's status. */
export const exitCodeOf = (status: string): number => FINAL[status] ?? EXIT.failed;

function describeStep(data: Record<string, any>): string {
  const args = data.args ?? {};
  const what = typeof args.command === 'string' ? args.command : JSON.stringify(args);
  return `${data.tool}${data.name ? ` (${data.name})` : ''}: ${what.length > 120 ? `${what.slice(0, 117)}...` : what}`;
}

/**
 * Prints events as a person reads them. Output comes in chunks that may split a line: a line of the
 * tool's own is ended before one of ours is printed. A step's output is a tool's real output: its colours
 * are kept, and reset before a line of ours (a colour, or text hidden, left on would reach it); every other
 * escape sequence is dropped. Every other text of an event (a message, a reason, an error) is the server's,
 * its control characters shown as escapes.
 */
function eventPrinter(o: Output, runId: string): (e: ServiceEvent) => void {
  let midLine = false;
  let styled = false;
  const line = (text: string) => {
    if (midLine) o.out('\n');
    if (styled) o.out('\u001b[0m');
    midLine = false;
    styled = false;
    o.out(text);
  };
  return (e) => {
    if (e.type === 'step.output') {
      const text = terminalSafe(String(e.data.text));
      o.out(e.data.stream === 'stderr' ? o.paint('yellow', text) : text);
      midLine = text.length > 0 && !text.endsWith('\n');
      styled ||= text.includes('\u001b[');
    } else printEvent((text, style) => line(`${style ? o.paint(style, visible(text)) : visible(text)}\n`), runId, e);
  };
}

/** One event as one line (or two), without its line break: `line` shows the server's text as escapes, and paints it. */
function printEvent(line: (text: string, style?: Parameters<Output['paint']>[0]) => void, runId: string, e: ServiceEvent): void {
  const d = e.data;
  switch (e.type) {
    case 'run.started':
      line(`run ${runId} started (attempt ${d.attempt}, waited ${seconds(d.queued_ms)} in the queue)`, 'dim');
      break;
    case 'step.started':
      line(`> step ${d.index + 1} ${describeStep(d)}`, 'cyan');
      break;
    case 'step.finished': {
      const ok = d.status === 'succeeded';
      const code = d.exit_code == null ? '' : `, exit code ${d.exit_code}`;
      line(
        `${ok ? 'ok' : 'FAIL'} step ${d.index + 1} ${d.status} in ${seconds(d.duration_ms)}${code}${d.error ? `: ${d.error.message}` : ''}`,
        ok ? 'green' : 'red',
      );
      break;
    }
    case 'run.retrying':
      line(`attempt ${d.attempt} ${d.status}; retrying as attempt ${d.next_attempt} in ${seconds(d.delay_ms)}`, 'yellow');
      break;
    case 'run.interrupted':
      line(`attempt ${d.attempt} interrupted (${d.reason}); it runs again as attempt ${d.next_attempt}`, 'yellow');
      break;
    case 'message.created':
      // a message of several lines stays so, each line after its first indented: none reads as a line of ours
      for (const [i, text] of String(d.text ?? '')
        .replace(/\n+$/, '')
        .split('\n')
        .entries())
        line(i ? `  ${text}` : `[${d.role}] ${text}`);
      break;
    case 'run.finished': {
      const colour = d.status === 'succeeded' ? 'green' : 'red';
      line(`run ${runId} ${d.status} in ${seconds(d.duration_ms)}${d.summary ? `: ${d.summary}` : ''}`, ['bold', colour]);
      if (d.error && d.status !== 'succeeded') line(`  ${d.error.code}: ${d.error.message}`);
      break;
    }
  }
}

export type WatchOptions = { cancelOnInterrupt?: boolean; idleTimeout?: number };

/**
 * Follows a run to its end and returns the exit code of its status. Ctrl-C asks whether to cancel the
 * run (at a terminal), cancels it (--cancel-on-interrupt), or leaves it running and exits 130.
 */
export async function watchRun(client: ApiClient, o: Output, run: Run, opts: WatchOptions = {}): Promise<number> {
  if (FINAL[run.status] !== undefined && o.json) {
    o.printJson(run);
    return exitCodeOf(run.status);
  }
  let interrupts = 0;
  // the run's id as the service gave it (runs watch): shown, never obeyed by the terminal
  const shown = visible(String(run.id));
  const detach = () => {
    o.err(`left run ${shown} running; follow it again with: automation-service runs watch ${shown}\n`);
    process.exit(EXIT.interrupted);
  };
  const cancel = async () => {
    o.err(`canceling run ${shown}...\n`);
    await client.request('POST', `/api/v1/runs/${run.id}/cancel`).catch((err: Error) => o.err(`cancel failed: ${err.message}\n`));
  };
  const onInterrupt = async () => {
    if (++interrupts > 1) detach();
    if (opts.cancelOnInterrupt) return cancel();
    if (!process.stdin.isTTY) return detach();
    const rl = readline.createInterface({ input: process.stdin, output: process.stderr });
    // a second Ctrl-C at the prompt (or Ctrl-D) closes it without an answer: no is the default
    const answer = await rl
      .question(`\ncancel run ${shown}? [y/N] `)
      .catch(() => '')
      .finally(() => rl.close());
    if (/^y(es)?$/i.test(answer.trim())) return cancel();
    detach();
  };
  const handler = () => void onInterrupt();
  const print = eventPrinter(o, run.id);
  // CI cancels a job with SIGTERM (GitLab, Buildkite) or SIGINT then SIGTERM (GitHub Actions): both interrupt
  for (const signal of INTERRUPTS) process.on(signal, handler);
  try {
    // a session task's run shares its session's log with the other tasks' runs: the run session stream ends at
    // the first of their ends, the session's trace goes on (the tool stops at this run's own)
    const stream = run.kind === 'session_task' ? `/api/v1/sessions/${run.session_id}/trace` : `/api/v1/autonomy/streaming/${run.session_id}/events`;
    const last = await client.follow(stream, {
      isLast: (e) => e.type === 'run.finished' && (!e.run_id || e.run_id === run.id),
      onEvent: (e) => {
        if (!o.json && (!e.run_id || e.run_id === run.id)) print(e);
      },
      onReconnect: (attempt, why) => o.err(`(event stream dropped: ${why}; reconnecting, try ${attempt})\n`, 'dim'),
      idleMs: opts.idleTimeout === undefined ? undefined : opts.idleTimeout * 1000,
    });
    if (last) {
      if (o.json) o.printJson(await client.request('GET', `/api/v1/runs/${run.id}`));
      return exitCodeOf(String(last.data.status));
    }
    // the service has no more events of the run (its log is kept 7 days, and Redis may lose it): the run
    // itself says how it ended
    const now = await client.request<Run>('GET', `/api/v1/runs/${run.id}`);
    if (FINAL[now.status] === undefined)
      throw new CliError(
        `the service sends no more events of run ${run.id}, which is ${now.status}; look again with: automation-service runs get ${run.id}`,
        EXIT.unavailable,
      );
    if (o.json) o.printJson(now);
    else
      print({
        id: '',
        type: 'run.finished',
        run_id: run.id,
        data: { status: now.status, duration_ms: now.duration_ms, summary: now.summary, error: now.error },
      });
    return exitCodeOf(now.status);
  } finally {
    for (const signal of INTERRUPTS) process.off(signal, handler);
  }
}

const INTERRUPTS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;

export function printRun(o: Output, run: Run & Record<string, any>): void {
  if (o.json) return o.printJson(run);
  // every field is the server's: shown, never obeyed by the terminal
  const line = (text: string) => o.out(`${visible(text)}\n`);
  line(`${run.id}  ${run.kind}  ${run.status}${run.duration_ms != null ? ` in ${seconds(run.duration_ms)}` : ''}`);
  if (run.summary) line(`  ${run.summary}`);
  if (run.error) line(`  ${run.error.code}: ${run.error.message}`);
  for (const [i, s] of (run.steps ?? []).entries())
    line(`  step ${i + 1} ${s.tool} ${s.status ?? ''}${s.duration_ms != null ? ` in ${seconds(s.duration_ms)}` : ''}`);
  line(`  session ${run.session_id}; created ${run.created_at ?? '-'}`);
}

export function printRuns(o: Output, page: { data: Run[]; next_cursor?: string | null }): void {
  if (o.json) return o.printJson(page);
  o.table(page.data, [
    ['ID', (r) => r.id],
    ['KIND', (r) => r.kind],
    ['STATUS', (r) => r.status],
    ['DURATION', (r) => seconds(r.duration_ms)],
    ['CREATED', (r) => r.created_at],
    ['AUTOMATION', (r) => r.automation_id],
  ]);
  if (page.next_cursor) o.out(`more: --cursor ${visible(page.next_cursor)}\n`);
}

export const usage = (message: string) => new CliError(message, EXIT.usage);

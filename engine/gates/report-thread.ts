// A thread that reads one large gate report (parseReport) off the process's event loop: a 7.8 MB TAP
// report held it for 2.4 s, and with it every request and run of the process.
import { parentPort, workerData } from 'node:worker_threads';
import { parseReport } from './reports.js';

const { format, text, workspace } = workerData as { format: Parameters<typeof parseReport>[0]; text: string; workspace: string };
parentPort!.postMessage(await parseReport(format, text, workspace));

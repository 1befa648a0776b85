// A bound on work, not on the machine: the CPU time this process spends doing something. Its wall time
// counts the other processes of a loaded machine too (a trigger check of about 100 ms took 577 ms of wall
// time beside a full suite and a busy loop on a 2-core machine).

/** `work`'s answer and the CPU time (user + system, in ms) the process spent while it ran. */
export function cpuMs<T>(work: () => T): { value: T; ms: number } {
  const before = process.cpuUsage();
  const value = work();
  const { user, system } = process.cpuUsage(before);
  return { value, ms: (user + system) / 1000 };
}

// Work of one caller held to a few things at once (files read, a provider's answers).

/** Runs tasks given to it at most `n` at a time, in the order given. */
export function limited(n: number) {
  let running = 0;
  const waiting: (() => void)[] = [];
  return async <T>(task: () => Promise<T>): Promise<T> => {
    if (running < n) running++;
    else await new Promise<void>((start) => waiting.push(start)); // its slot is handed over by the task that ends
    try {
      return await task();
    } finally {
      const next = waiting.shift();
      if (next) next();
      else running--;
    }
  };
}

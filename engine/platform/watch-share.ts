// A chokidar watcher held to a share of the host's inotify watches, which every process of the user shares
// (the file triggers' and the smart gates' watchers among them): chokidar watches each file and each folder,
// so one tenant's tree could otherwise take the watches every other watcher needs.
import { watch, type FSWatcher } from 'chokidar';

export type SharedWatch = {
  readonly watcher: FSWatcher;
  /** chokidar's `ready`: the folder has been read (and let go by then if it was past its share) */
  readonly ready: Promise<void>;
  /** the files and folders it holds a watch on now (the count grows as the folder is read); 0 once let go */
  readonly entries: number;
};

/**
 * Watches `dir` (no initial events, links not followed), counting what it holds for as long as it watches:
 * past `max`, or once all the watchers hold more than `total` (`held()`, this one included), it is let go,
 * at once or as soon as the folder has grown past its share, and `letGo` is told what it held then. What is
 * removed is counted off. `skip` names what is not watched at all, and so not counted.
 */
export function watchWithinShare(
  dir: string,
  o: {
    skip(p: string, stats?: { isSymbolicLink(): boolean }): boolean;
    max: number;
    total: number;
    held(): number;
    letGo(held: number): void;
  },
): SharedWatch {
  // chokidar offers a path without its stats and then with them: each counted once, with them
  const seen = new Set<string>();
  let over = false;
  let isReady = false;
  const letGo = () => {
    const held = seen.size;
    seen.clear();
    o.letGo(held);
    void watcher.close();
  };
  const watcher = watch(dir, {
    ignoreInitial: true,
    followSymlinks: false,
    ignored: (p: string, stats?: { isSymbolicLink(): boolean }) => {
      if (over || o.skip(p, stats)) return true;
      if (stats) seen.add(p);
      if (seen.size <= o.max && o.held() <= o.total) return false;
      over = true;
      if (isReady) letGo();
      return true;
    },
  });
  const countOff = (p: string) => void seen.delete(p);
  watcher.on('unlink', countOff).on('unlinkDir', countOff);
  const ready = new Promise<void>((resolve) =>
    watcher.once('ready', () => {
      isReady = true;
      if (over) letGo();
      resolve();
    }),
  );
  return {
    watcher,
    ready,
    get entries() {
      return seen.size;
    },
  };
}

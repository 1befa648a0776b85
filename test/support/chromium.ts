// Debian's Chromium for the browser tests (.ci/run installs it): launched headless, or the suite skipped
// with a line that says why (in CI its absence is an error).
import fs from 'node:fs';
import { chromium, type Browser } from 'playwright-core';

const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

/** The browser, or null after saying why there is none (the caller skips). */
export async function launchChromium(): Promise<Browser | null> {
  if (!fs.existsSync(CHROMIUM)) {
    if (process.env.CI) throw new Error(`no Chromium at ${CHROMIUM}: .ci/run installs Debian's chromium package`);
    console.log(`      skipped: no Chromium at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM_PATH)`);
    return null;
  }
  return chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}

// Renders /docs and /redoc in headless Chromium (Debian's package; .ci/run installs it) and uses
// Swagger UI's "try it out" against this origin with an API key.
import { expect } from 'chai';
import type { Browser } from 'playwright-core';
import { launchChromium } from '../support/chromium.js';
import { KEYS, startHarness, type Harness } from '../support/harness.js';

describe('documentation in a browser', function () {
  this.timeout(60_000);
  let h: Harness;
  let browser: Browser;

  before(async function () {
    const launched = await launchChromium();
    if (!launched) return this.skip();
    browser = launched;
    h = await startHarness();
    await h.call('POST', '/api/v1/automations', { body: { name: 'seen through swagger', steps: [{ tool: 'message', args: { text: 'x' } }] } });
  });
  after(async () => {
    await browser?.close();
    await h?.close();
  });

  it('renders Swagger UI with the automation operations, and "try it out" works with an API key', async () => {
    const page = await browser.newPage();
    const external: string[] = [];
    page.on('request', (r) => {
      if (!r.url().startsWith(h.url) && !r.url().startsWith('data:') && !r.url().startsWith('blob:')) external.push(r.url());
    });
    await page.goto(`${h.url}/docs`);
    await page.waitForSelector('.opblock-summary-path', { timeout: 20_000 });
    const paths = await page.$$eval('.opblock-summary-path', (els) => els.map((e) => e.textContent?.replace(/\u200b/g, '').trim()));
    expect(paths).to.include('/api/v1/automations');
    expect(paths).to.include('/api/v1/automations/templates/instantiate');
    expect(paths).to.include('/api/v1/automations/{id}/enable');

    // authorize with a key, then run GET /api/v1/automations from the page
    await page.evaluate((key) => (globalThis as any).ui.preauthorizeApiKey('apiKeyHeader', key), KEYS.a);
    const op = page.locator('#operations-automations-listAutomations');
    await op.locator('.opblock-summary').click();
    await op.locator('button.try-out__btn').click();
    await op.locator('button.execute').click();
    const status = op.locator('.live-responses-table tr.response .response-col_status').first();
    await status.waitFor({ timeout: 10_000 });
    expect((await status.textContent())?.trim()).to.equal('200');
    expect(await op.locator('.live-responses-table .microlight, .live-responses-table pre').first().textContent()).to.contain('seen through swagger');
    expect(external, 'requests to other origins').to.deep.equal([]);
    await page.close();
  });

  it('renders Redoc with the automation operations, loading nothing from other origins', async () => {
    const page = await browser.newPage();
    const external: string[] = [];
    page.on('request', (r) => {
      if (!r.url().startsWith(h.url) && !r.url().startsWith('data:') && !r.url().startsWith('blob:')) external.push(r.url());
    });
    await page.goto(`${h.url}/redoc`);
    await page.waitForSelector('h2', { timeout: 20_000 });
    const text = await page.locator('body').innerText();
    expect(text).to.contain('Create an automation');
    expect(text).to.contain('Create an automation from a template');
    expect(text).to.contain('Archive an automation');
    expect(external, 'requests to other origins').to.deep.equal([]);
    await page.close();
  });
});

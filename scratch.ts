import { startHarness } from './test/support/harness.js';
const h = await startHarness();
const r = await h.call('GET', '/api/v1/automations?cursor=forged');
console.log(r.status, r.text.slice(0, 300));
console.log(h.logs.filter(l => l.includes('"level":50')).join('\n').slice(0, 3000));
await h.close();

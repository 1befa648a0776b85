// One contract for every store adapter. Each adapter's test file calls storeContract with a factory.
import { expect } from 'chai';
import { newId } from '../../engine/ids.js';
import type { ApiKeyRecord, Automation } from '../../engine/model.js';
import type { Store } from '../../engine/store/port.js';

export function automationFixture(tenantId: string, over: Partial<Automation> = {}): Automation {
  const now = new Date().toISOString();
  return {
    id: newId('aut'),
    tenant_id: tenantId,
    name: 'fixture',
    description: null,
    status: 'enabled',
    triggers: [{ type: 'manual' }],
    tool_allowlist: ['shell'],
    budget: { seconds: 60 },
    steps: [{ tool: 'shell', args: { command: 'true' } }],
    goal: null,
    inputs: { nested: { deep: [1, 2, { x: null }] } },
    template: null,
    created_at: now,
    updated_at: now,
    ...over,
  };
}

export function storeContract(name: string, open: () => Promise<Store>): void {
  describe(`store contract: ${name}`, () => {
    let store: Store;
    beforeEach(async () => {
      store = await open();
    });
    afterEach(async () => {
      await store.close();
    });

    it('answers ping', async () => {
      await store.ping();
    });

    it('round-trips an automation exactly', async () => {
      const a = automationFixture('t1');
      await store.automations.insert(a);
      expect(await store.automations.get('t1', a.id)).to.deep.equal(a);
    });

    it('never shows one tenant another tenant’s automation', async () => {
      const a = automationFixture('t1');
      await store.automations.insert(a);
      expect(await store.automations.get('t2', a.id)).to.equal(null);
      expect((await store.automations.list('t2', { limit: 10 })).items).to.deep.equal([]);
      expect(await store.automations.update('t2', a.id, { name: 'stolen' }, ['enabled'])).to.equal(null);
      expect((await store.automations.get('t1', a.id))!.name).to.equal('fixture');
    });

    it('updates only while the status is expected', async () => {
      const a = automationFixture('t1');
      await store.automations.insert(a);
      const disabled = await store.automations.update('t1', a.id, { status: 'disabled' }, ['enabled']);
      expect(disabled!.status).to.equal('disabled');
      expect(await store.automations.update('t1', a.id, { status: 'archived' }, ['enabled'])).to.equal(null);
      expect((await store.automations.get('t1', a.id))!.status).to.equal('disabled');
      const renamed = await store.automations.update('t1', a.id, { name: 'renamed' }, ['enabled', 'disabled']);
      expect(renamed).to.deep.include({ id: a.id, tenant_id: 't1', name: 'renamed', status: 'disabled', created_at: a.created_at });
    });

    it('lists newest first with cursor pages, hiding archived unless asked', async () => {
      const made: Automation[] = [];
      for (let i = 0; i < 5; i++) {
        const a = automationFixture('t1', { name: `a${i}`, status: i === 2 ? 'archived' : i === 3 ? 'disabled' : 'enabled' });
        await store.automations.insert(a);
        made.push(a);
      }
      const first = await store.automations.list('t1', { limit: 2 });
      expect(first.items.map((a) => a.name)).to.deep.equal(['a4', 'a3']);
      expect(first.next_cursor).to.be.a('string');
      const second = await store.automations.list('t1', { limit: 2, cursor: first.next_cursor! });
      expect(second.items.map((a) => a.name)).to.deep.equal(['a1', 'a0']);
      expect(second.next_cursor).to.equal(null);
      const archived = await store.automations.list('t1', { limit: 10, statuses: ['archived'] });
      expect(archived.items.map((a) => a.name)).to.deep.equal(['a2']);
      const all = await store.automations.list('t1', { limit: 10, statuses: ['enabled', 'disabled', 'archived'] });
      expect(all.items).to.have.length(5);
      const disabled = await store.automations.list('t1', { limit: 10, statuses: ['disabled'] });
      expect(disabled.items.map((a) => a.name)).to.deep.equal(['a3']);
    });

    it('refuses a cursor it did not issue', async () => {
      let error: unknown;
      try {
        await store.automations.list('t1', { limit: 2, cursor: 'not-a-cursor' });
      } catch (err) {
        error = err;
      }
      expect(error).to.have.property('code', 'validation-failed');
    });

    it('stores api keys by hash, once, and finds them by hash', async () => {
      const k: ApiKeyRecord = { id: newId('key'), tenant_id: 't1', hash: 'ab'.repeat(32), label: null, source: 'cli', created_at: new Date().toISOString() };
      expect(await store.apiKeys.insert(k)).to.equal(true);
      expect(await store.apiKeys.insert({ ...k, id: newId('key') })).to.equal(false);
      expect(await store.apiKeys.findByHash(k.hash)).to.deep.equal(k);
      expect(await store.apiKeys.findByHash('cd'.repeat(32))).to.equal(null);
      expect(await store.apiKeys.list('t1')).to.deep.equal([k]);
      expect(await store.apiKeys.list('t2')).to.deep.equal([]);
    });
  });
}

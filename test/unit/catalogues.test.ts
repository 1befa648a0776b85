// The lists the code and the contract share are one list: event types and error codes in
// engine/platform match what api/openapi.yaml documents.
import { expect } from 'chai';
import { loadSpec } from '../../api/spec.js';
import { ERROR_STATUS, EVENT_TYPES } from '../../engine/platform/index.js';

type Schema = {
  enum?: string[];
  const?: string;
  oneOf?: { $ref: string }[];
  discriminator?: { mapping: Record<string, string> };
  properties?: Record<string, Schema>;
};

describe('catalogues', () => {
  const schemas = (loadSpec() as unknown as { components: { schemas: Record<string, Schema> } }).components.schemas;

  it('documents every event type of the catalogue in ServiceEvent, each with its own payload schema', () => {
    const event = schemas.ServiceEvent!;
    expect(Object.keys(event.discriminator!.mapping)).to.deep.equal([...EVENT_TYPES]);
    for (const [type, ref] of Object.entries(event.discriminator!.mapping)) {
      const variant = schemas[ref.split('/').pop()!]!;
      expect(variant.properties!.type!.const, ref).to.equal(type);
      expect(event.oneOf!.map((o) => o.$ref)).to.include(ref);
    }
  });

  it('lists in Problem.code exactly the error codes the service answers with', () => {
    expect([...schemas.Problem!.properties!.code!.enum!].sort()).to.deep.equal(Object.keys(ERROR_STATUS).sort());
  });
});

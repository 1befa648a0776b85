import { expect } from 'chai';
import { ValidationError } from '../../engine/platform/errors.js';
import { instantiateTemplate, parseTemplate } from '../../engine/automations/templates.js';

const GOOD = `
id: sample
name: Sample
description: A sample.
category: test
variables:
  - name: repo
    type: string
    required: true
    description: The repository.
  - name: steps
    type: integer
    default: 7
    description: Most steps.
  - name: level
    type: string
    default: low
    enum: [low, high]
    description: How hard.
automation:
  name: Sample for {{repo}}
  budget: { seconds: 60, max_steps: '{{steps}}' }
  goal: Look at {{ repo }} at level {{level}}.
`;

describe('engine/templates', () => {
  it('parses a template and substitutes typed variables', () => {
    const t = parseTemplate(GOOD, '/x/sample.yaml');
    const { definition, variables } = instantiateTemplate(t, { repo: 'acme/api' });
    expect(definition.name).to.equal('Sample for acme/api');
    expect(definition.budget).to.deep.equal({ seconds: 60, max_steps: 7 });
    expect(definition.goal).to.equal('Look at acme/api at level low.');
    expect(variables).to.deep.equal({ repo: 'acme/api', steps: 7, level: 'low' });
  });

  it('names missing, unknown and mistyped variables', () => {
    const t = parseTemplate(GOOD, '/x/sample.yaml');
    try {
      instantiateTemplate(t, { steps: 'many', level: 'medium', colour: 'red' });
      expect.fail('should have thrown');
    } catch (err) {
      expect(err).to.be.instanceOf(ValidationError);
      const paths = (err as ValidationError).errors.map((e) => e.path).sort();
      expect(paths).to.deep.equal(['/body/variables/colour', '/body/variables/level', '/body/variables/repo', '/body/variables/steps']);
      expect((err as Error).message)
        .to.contain('colour')
        .and.contain('repo');
    }
  });

  it('refuses a file whose id does not match its name, or that uses undeclared variables', () => {
    expect(() => parseTemplate(GOOD, '/x/other.yaml')).to.throw(/match the file name/);
    expect(() => parseTemplate(GOOD.replace('{{level}}', '{{mystery}}'), '/x/sample.yaml')).to.throw(/undeclared variables: mystery/);
    expect(() => parseTemplate('id: [', '/x/sample.yaml')).to.throw();
    expect(() => parseTemplate(GOOD.replace('default: 7', 'default: seven'), '/x/sample.yaml')).to.throw(/default is not of type integer/);
  });
});

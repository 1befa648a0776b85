// The command-line tool's --help (cli/program.ts): every command shows examples (the README says so), and
// --cancel-on-interrupt says what it does, not what Ctrl-C does without it.
import { expect } from 'chai';
import type { Command } from 'commander';
import { buildProgram } from '../../cli/program.js';

/** What `automation-service <path> --help` prints, for every command that has no subcommands. */
function helpOfEach(cmd: Command, path: string[] = []): Map<string, string> {
  const helps = new Map<string, string>();
  if (!cmd.commands.length) {
    let text = '';
    cmd.configureOutput({ writeOut: (s) => (text += s) }).outputHelp();
    helps.set(path.join(' '), text);
  }
  for (const sub of cmd.commands) for (const [p, h] of helpOfEach(sub, [...path, sub.name()])) helps.set(p, h);
  return helps;
}

describe('the command-line tool’s --help', () => {
  const helps = helpOfEach(buildProgram());

  it('shows examples of the command itself for every command', () => {
    expect(helps.size).to.be.above(20);
    for (const [path, help] of helps) expect(help, path).to.match(new RegExp(`\\nExamples:\\n(  \\$ .*\\n?)*  \\$ (.*\\| )?automation-service ${path}\\b`));
  });

  it('says --cancel-on-interrupt cancels without asking', () => {
    for (const path of ['run', 'automations run', 'runs watch']) {
      const help = helps.get(path)!.replace(/\s+/g, ' ');
      expect(help, path).to.match(/--cancel-on-interrupt (with --wait: )?Ctrl-C cancels the run without asking \(without this option Ctrl-C asks/);
    }
  });
});

import { expect } from 'chai';
import picomatch from 'picomatch';
import { compileGlobs, globSyntaxError, MAX_BRACE_EXPANSION } from '../../engine/automations/globs.js';
import { cpuMs } from '../support/cpu.js';

describe('engine/globs', () => {
  it('matches as picomatch (dot: true) does, for the syntax it takes', () => {
    const globs = ['d0/**', '**', '*', 'src/**/*.ts', 'f{1..3}.txt', 'f{a,b}.txt', 'f{a}.txt', './a.txt', '!*.md', 'a**b', '**/b', 'a/**/b', '[a-c].txt'];
    globs.push('\\*.txt', '[abc', 'x]', '*.{ts,js}', 'a/{b,c/d}/e', 'a{,.txt}', '{a,b', '**/*', 'a/*', '?', 'a/.*', '.*', 'a?b', '*.txt', '{a,b}/**');
    globs.push('$a', '^a', 'a+b', 'a.b', 'a|b', 'src/*/x/**/*.{md,txt}', '!{a,b}', '**/node/*.js', '*/*', '.env*', '[0-9][0-9].log', '??.txt', '**/a/**');
    const paths = [
      'd0',
      'd0/a/b',
      'a',
      'b',
      'a/b',
      '.git',
      '.env',
      '.env.local',
      'src/a.ts',
      'src/lib/b.ts',
      'f2.txt',
      'f4.txt',
      'fa.txt',
      'f{a}.txt',
      'a.txt',
    ];
    paths.push('x/y.md', 'y.md', 'aXb', 'aX/Yb', 'a/c/b', '*.txt', '[abc', 'x]', 'a.js', 'a/c/d/e', 'a/b/e', '{a,b', 'a/.b/c', 'a/.x', '..', 'a/b.txt');
    paths.push('b/c', '$a', '^a', 'a+b', 'a.b', 'a|b', 'src/q/x/y/z.md', 'src/q/x/z.txt', 'w/node/x.js', '12.log', '1a.log', 'ab.txt', 'x/a/y', 'é.txt');
    for (const glob of globs) {
      const theirs = picomatch(glob, { dot: true });
      const ours = compileGlobs([glob]);
      for (const p of paths) expect(ours(p), `${glob} ${p}`).to.equal(theirs(p));
    }
    expect(compileGlobs(['*.md', 'src/**'])('src/a/b.ts')).to.equal(true); // any of them
  });

  it('reads a ! glob of a list as an exclusion from the others, never as a match of its own', () => {
    const paths = ['src/a.ts', 'src/gen/x.ts', 'src/gen/deep/y.ts', 'README.md', 'lib/b.ts'];
    const taken = (globs: string[]) => paths.filter(compileGlobs(globs));
    expect(taken(['src/**', '!src/gen/**'])).to.deep.equal(['src/a.ts']);
    expect(taken(['!src/gen/**', 'src/**']), 'the ! glob first').to.deep.equal(['src/a.ts']);
    expect(taken(['src/**', 'lib/**', '!src/gen/**', '!**/y.ts'])).to.deep.equal(['src/a.ts', 'lib/b.ts']);
    expect(taken(['!src/gen/**']), 'only ! globs: every path they do not match').to.deep.equal(['src/a.ts', 'README.md', 'lib/b.ts']);
    expect(taken(['!src/**', '!*.md'])).to.deep.equal(['lib/b.ts']);
    expect(taken(['src/**', '!{src/gen,lib}/**'])).to.deep.equal(['src/a.ts']);
    expect(taken([])).to.deep.equal([]);
  });

  it('takes time in proportion to the glob and the path, however many wildcards (picomatch took minutes)', () => {
    // each of these, as a regular expression, backtracks for minutes or forever on the paths below
    const hostile = ['*a'.repeat(249) + 'b', '**/*a'.repeat(83) + 'b', '?*'.repeat(249) + 'b', '[a-z]*'.repeat(80) + 'b', '**/a'.repeat(100) + 'b'];
    const paths = ['a'.repeat(255), 'a/'.repeat(2000) + 'a', `${'a'.repeat(255)}/`.repeat(15) + 'a'];
    const { ms } = cpuMs(() => {
      for (const glob of hostile) for (const p of paths) expect(compileGlobs([glob])(p)).to.equal(false);
    });
    expect(ms).to.be.below(1000);
  });

  it('refuses the syntax it does not take: extended globs, POSIX classes, (a|b) groups, braces that expand too far', () => {
    for (const glob of ['*([a-z]|a)b', '@(a|a*)', '+(a)', '!(a).ts', '?(x)']) expect(globSyntaxError(glob), glob).to.match(/extended globs/);
    expect(globSyntaxError('[[:alpha:]].txt')).to.match(/POSIX/);
    expect(globSyntaxError('src/(a|b).ts')).to.match(/groups/);
    expect(globSyntaxError('{a,b}'.repeat(7))).to.contain(String(MAX_BRACE_EXPANSION));
    expect(globSyntaxError('f{1..1000000}')).to.contain(String(MAX_BRACE_EXPANSION));
    for (const glob of ['src/**/*.ts', 'file (1).txt', '!*.md', '{a,b}/{c,d}/{e,f}', 'f{1..9}.log']) expect(globSyntaxError(glob), glob).to.equal(null);
  });
});

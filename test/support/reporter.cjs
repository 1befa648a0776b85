// mocha's spec reporter, plus the closing line CI reads: `N passed, N failed, N skipped`.
'use strict';
const Mocha = require('mocha');

class SummaryReporter extends Mocha.reporters.Spec {
  constructor(runner, options) {
    super(runner, options);
    runner.once(Mocha.Runner.constants.EVENT_RUN_END, () => {
      const { passes, failures, pending } = runner.stats ?? this.stats;
      // after the spec reporter's own epilogue
      process.nextTick(() => process.stdout.write(`\n${passes} passed, ${failures} failed, ${pending} skipped\n`));
    });
  }
}

module.exports = SummaryReporter;

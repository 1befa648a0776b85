// The built-in automation templates: YAML data files in templates/, one template a file, named by
// its id. The catalog loads them at start and, when watching, picks up a changed file without a
// restart; a broken file is logged and the last good version of that template stays.
import fs from 'node:fs/promises';
import path from 'node:path';
import Ajv2020Module from 'ajv/dist/2020.js';
import { watch, type FSWatcher } from 'chokidar';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { openApiDocument } from '../../config/openapi-document.js';
import { ValidationError, type FieldError, type Logger, type AutomationDefinition } from '../platform/index.js';

const Ajv2020 = Ajv2020Module as unknown as typeof Ajv2020Module.default;
let definitionValidator: ReturnType<InstanceType<typeof Ajv2020>['compile']> | undefined;

/**
 * What is wrong with an automation a template made, by the spec's AutomationDefinition (the schema a
 * definition posted directly is held to): a variable's value substituted into it may break a limit
 * (a budget of 0, a name of 5,000 characters) that no variable type says.
 */
function definitionErrors(definition: unknown): FieldError[] {
  if (!definitionValidator) {
    const spec = openApiDocument() as { components: Record<string, unknown> };
    const ajv = new Ajv2020({ allErrors: true, strict: false });
    definitionValidator = ajv.compile({ $ref: '#/components/schemas/AutomationDefinition', components: spec.components });
  }
  if (definitionValidator(definition)) return [];
  return (definitionValidator.errors ?? []).map((e) => ({
    path: '/body/variables',
    message: `the automation they make is not valid: ${e.instancePath || '/'} ${e.message ?? 'is not valid'}`,
  }));
}

const VARIABLE_TYPES = ['string', 'integer', 'number', 'boolean'] as const;
type VariableType = (typeof VARIABLE_TYPES)[number];

export type TemplateVariable = {
  name: string;
  type: VariableType;
  required: boolean;
  default?: string | number | boolean;
  enum?: (string | number)[];
  /** a regular expression a string value matches whole */
  pattern?: string;
  description: string;
};

export type Template = {
  id: string;
  name: string;
  description: string;
  category: string;
  variables: TemplateVariable[];
  /** an automation definition whose strings may hold {{variable}} placeholders */
  automation: AutomationDefinition;
};

const PLACEHOLDER = /\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}/g;
const WHOLE_PLACEHOLDER = /^\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}$/;
const TEMPLATE_FILE = /^[a-z0-9][a-z0-9-]*\.ya?ml$/;

const variableSchema = z
  .object({
    name: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/),
    type: z.enum(VARIABLE_TYPES),
    required: z.boolean().default(false),
    default: z.union([z.string(), z.number(), z.boolean()]).optional(),
    enum: z
      .array(z.union([z.string(), z.number()]))
      .min(1)
      .optional(),
    pattern: z
      .string()
      .refine((p) => {
        try {
          new RegExp(p);
          return true;
        } catch {
          return false;
        }
      }, 'a regular expression')
      .optional(),
    description: z.string().min(1),
  })
  .strict();

const templateSchema = z
  .object({
    id: z.string().regex(/^[a-z0-9][a-z0-9-]*$/),
    name: z.string().min(1),
    description: z.string().min(1),
    category: z.string().min(1),
    variables: z.array(variableSchema),
    automation: z.looseObject({ name: z.string().min(1) }),
  })
  .strict();

function typeMatches(type: VariableType, value: unknown): boolean {
  switch (type) {
    case 'string':
      return typeof value === 'string';
    case 'integer':
      return Number.isInteger(value);
    case 'number':
      return typeof value === 'number' && Number.isFinite(value);
    case 'boolean':
      return typeof value === 'boolean';
  }
}

function placeholdersIn(value: unknown, found: Set<string> = new Set()): Set<string> {
  if (typeof value === 'string') for (const m of value.matchAll(PLACEHOLDER)) found.add(m[1]!);
  else if (Array.isArray(value)) value.forEach((v) => placeholdersIn(v, found));
  else if (value && typeof value === 'object') Object.values(value).forEach((v) => placeholdersIn(v, found));
  return found;
}

/** Parses and checks one template file; throws an Error that says what is wrong. */
export function parseTemplate(text: string, file: string): Template {
  const parsed = templateSchema.safeParse(parseYaml(text));
  if (!parsed.success) {
    throw new Error(parsed.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; '));
  }
  const t = parsed.data as Template;
  const expectedId = path.basename(file).replace(/\.ya?ml$/, '');
  if (t.id !== expectedId) throw new Error(`id "${t.id}" must match the file name "${expectedId}"`);
  const declared = new Set(t.variables.map((v) => v.name));
  if (declared.size !== t.variables.length) throw new Error('variables: a name is declared twice');
  for (const v of t.variables) {
    if (v.default !== undefined && !typeMatches(v.type, v.default)) throw new Error(`variables.${v.name}: default is not of type ${v.type}`);
  }
  const undeclared = [...placeholdersIn(t.automation)].filter((n) => !declared.has(n));
  if (undeclared.length) throw new Error(`automation uses undeclared variables: ${undeclared.join(', ')}`);
  return t;
}

function substitute(value: unknown, vars: Record<string, unknown>): unknown {
  if (typeof value === 'string') {
    const whole = WHOLE_PLACEHOLDER.exec(value);
    if (whole) return vars[whole[1]!]; // keeps the variable's type: "{{max_steps}}" -> 40
    return value.replace(PLACEHOLDER, (_, name: string) => String(vars[name] ?? ''));
  }
  if (Array.isArray(value)) return value.map((v) => substitute(v, vars));
  if (value && typeof value === 'object') return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, substitute(v, vars)]));
  return value;
}

/** Checks the variables a caller gives against the template and returns the automation to create. */
export function instantiateTemplate(t: Template, given: Record<string, unknown>): { definition: AutomationDefinition; variables: Record<string, unknown> } {
  const errors: FieldError[] = [];
  const known = new Map(t.variables.map((v) => [v.name, v]));
  for (const name of Object.keys(given)) {
    if (!known.has(name)) {
      errors.push({ path: `/body/variables/${name}`, message: `unknown variable; ${t.id} takes: ${[...known.keys()].join(', ') || 'none'}` });
    }
  }
  const values: Record<string, unknown> = {};
  for (const v of t.variables) {
    const value = given[v.name] ?? v.default;
    // a required string of blanks is no value: the automation it made could never work
    if (value === undefined || value === null || (v.required && typeof value === 'string' && !value.trim())) {
      if (v.required) errors.push({ path: `/body/variables/${v.name}`, message: `required: ${v.description}` });
      continue;
    }
    if (!typeMatches(v.type, value)) errors.push({ path: `/body/variables/${v.name}`, message: `must be of type ${v.type}` });
    // pasted into steps whose `${...}` the run reads as its own references: a value would lose its text, or
    // become a reference (an `if` that always holds)
    else if (typeof value === 'string' && value.includes('${'))
      errors.push({ path: `/body/variables/${v.name}`, message: 'must not hold ${: steps read it as a reference to the run’s inputs or steps' });
    else if (v.enum && !v.enum.includes(value as string | number))
      errors.push({ path: `/body/variables/${v.name}`, message: `must be one of ${v.enum.join(', ')}` });
    else if (v.pattern && typeof value === 'string' && !new RegExp(`^(?:${v.pattern})$`).test(value))
      errors.push({ path: `/body/variables/${v.name}`, message: `must match ${v.pattern}: ${v.description}` });
    else values[v.name] = value;
  }
  if (errors.length) throw new ValidationError(`the variables do not fit template ${t.id}: ${errors.map((e) => e.path.split('/').pop()).join(', ')}`, errors);
  const definition = substitute(t.automation, values) as AutomationDefinition;
  const broken = definitionErrors(definition);
  if (broken.length) throw new ValidationError(`the variables do not fit template ${t.id}: ${broken[0]!.message}`, broken);
  return { definition, variables: values };
}

export type TemplateCatalog = {
  list(): Template[];
  get(id: string): Template | undefined;
  /** Reads every template file once. */
  load(): Promise<void>;
  /** Starts watching the folder; resolves once the watcher is ready. */
  watch(): Promise<void>;
  close(): Promise<void>;
};

export function createTemplateCatalog(opts: { dir: string; log: Logger }): TemplateCatalog {
  const { dir, log } = opts;
  const byFile = new Map<string, Template>();
  let watcher: FSWatcher | undefined;

  async function read(file: string): Promise<void> {
    const name = path.basename(file);
    if (!TEMPLATE_FILE.test(name)) return;
    try {
      const t = parseTemplate(await fs.readFile(file, 'utf8'), file);
      byFile.set(name, t);
      log.debug({ template_id: t.id, file: name }, 'template loaded');
    } catch (err) {
      const kept = byFile.has(name) ? 'the last good version stays' : 'the template is not offered';
      log.error({ file: name, err: (err as Error).message }, `template file is broken; ${kept}`);
    }
  }

  return {
    list: () => [...byFile.values()].sort((a, b) => a.id.localeCompare(b.id)),
    get: (id) => [...byFile.values()].find((t) => t.id === id),
    async load() {
      const names = await fs.readdir(dir);
      await Promise.all(names.map((n) => read(path.join(dir, n))));
    },
    async watch() {
      if (watcher) return;
      watcher = watch(dir, { ignoreInitial: true, depth: 0, awaitWriteFinish: { stabilityThreshold: 50, pollInterval: 10 } });
      watcher.on('add', read).on('change', read);
      watcher.on('unlink', (file: string) => {
        if (byFile.delete(path.basename(file))) log.warn({ file: path.basename(file) }, 'template file removed');
      });
      watcher.on('error', (err) => log.error({ err }, 'template watcher failed'));
      await new Promise<void>((resolve) => watcher!.once('ready', () => resolve()));
    },
    async close() {
      await watcher?.close();
      watcher = undefined;
    },
  };
}

// /api/v1/autonomy/voice/transcribe: reads the audio (multipart `file`, or the raw body) as it streams,
// counting bytes and stopping at the limit, then hands it to the engine. Nothing is stored; the text may
// then become a session message or an autonomy run's goal.
import { createHash } from 'node:crypto';
import { Ajv2020 } from 'ajv/dist/2020.js';
import busboy from 'busboy';
import { Router, type Request, type Response } from 'express';
import { AudioRejectedError, PayloadTooLargeError, ValidationError } from '../../engine/platform/index.js';
import type { Engine } from '../../engine/index.js';
import { tenantOf } from '../auth.js';
import type { components } from '../schema.js';
import type { OpenApiDocument } from '../spec.js';
import { autonomyRunRequest, startAutonomyRun, type AutonomyWork } from './autonomy.js';
import { acceptedRun, acceptRun } from './runs.js';

/** The transcript, and what it became: the run's view is the one every 202 carries. */
type Answer = Omit<components['schemas']['Transcription'], 'run'> & { run?: ReturnType<typeof acceptedRun> };
type VoiceOptions = Omit<components['schemas']['TranscriptionUpload'], 'file'>;
type Upload = { bytes: Buffer; filename?: string; fields: Record<string, string> };

const MAX_FIELD_BYTES = 4096;
/** The longest goal a run takes (AutonomyRunRequest.goal). */
const MAX_GOAL_CHARS = 20_000;

export function voiceRouter(engine: Engine, spec: OpenApiDocument): Router {
  const router = Router();
  const optionsOf = fieldValidator(spec);

  router.post('/voice/transcribe', async (req: Request, res: Response) => {
    engine.voice.assertConfigured();
    const tenantId = tenantOf(req);
    const upload = await readUpload(req, res, engine.voice.maxBytes);
    // a raw body's options are query parameters (checked by the validator); a form's are its fields
    const opts: VoiceOptions = { ...(req.query as VoiceOptions), ...optionsOf(upload.fields) };
    if (opts.to && !opts.session_id) throw new ValidationError('`to` names an agent of a session', [{ path: '/body/to', message: 'needs session_id' }]);
    if (opts.workspace && !opts.run) throw new ValidationError('`workspace` is where a run starts', [{ path: '/body/workspace', message: 'needs run=true' }]);
    // a session that is not there, not the caller's or archived, or a run that would be refused, is refused before the provider is paid
    if (opts.session_id) await engine.sessions.assertCanPost(tenantId, opts.session_id, opts.to);
    if (opts.run) await engine.runs.assertAcceptable(tenantId, autonomyRunRequest(req, 'autonomy', spokenRun('…', opts.workspace)));

    const aborted = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) aborted.abort();
    });
    const out: Answer = await engine.voice.transcribe(tenantId, upload, {
      language: opts.language,
      prompt: opts.prompt,
      signal: aborted.signal,
      log: req.log,
    });
    if (!opts.session_id && !opts.run) {
      res.json(out);
      return;
    }
    const text = out.text.trim();
    if (!text) throw new AudioRejectedError('audio-invalid', 'no words were recognised in the audio; nothing was posted or started');
    if (opts.session_id)
      out.message = await engine.sessions.postMessage(tenantId, opts.session_id, { role: 'user', to: opts.to, parts: [{ type: 'text', text }] });
    if (!opts.run) {
      res.json(out);
      return;
    }
    if (text.length > MAX_GOAL_CHARS)
      throw new ValidationError('the transcript is too long to be a run goal', [
        { path: '/body/run', message: `a goal is at most ${MAX_GOAL_CHARS} characters` },
      ]);
    // a retry with the same key and the same audio returns the run the first one started, whatever the provider hears the second time
    const fingerprint = { kind: 'autonomy', voice: createHash('sha256').update(upload.bytes).digest('hex'), workspace: opts.workspace ?? null };
    const { run, replayed } = await startAutonomyRun(engine, req, 'autonomy', spokenRun(text, opts.workspace), fingerprint);
    out.run = acceptedRun(engine, run);
    acceptRun(res, engine, run, replayed, out);
  });

  return router;
}

/** The run a recording starts: its text as the goal, the defaults of `POST /autonomy/run` otherwise. */
const spokenRun = (goal: string, workspace: string | undefined): AutonomyWork => ({ goal, workspace, network: false, gates: false });

/** Checks a form's option fields against the spec's TranscriptionUpload (`run` from "true"/"false"); other fields are ignored. */
function fieldValidator(spec: OpenApiDocument): (fields: Record<string, string>) => VoiceOptions {
  const components = spec.components as { schemas: Record<string, { properties: Record<string, unknown> }> };
  const { file: _file, ...properties } = components.schemas.TranscriptionUpload!.properties;
  const names = Object.keys(properties);
  const ajv = new Ajv2020({ allErrors: true, strict: false, coerceTypes: true });
  const validate = ajv.compile({ type: 'object', properties, components });
  return (fields) => {
    const known: Record<string, unknown> = Object.fromEntries(Object.entries(fields).filter(([k]) => names.includes(k)));
    if (!validate(known))
      throw new ValidationError(
        'a form field is not valid',
        (validate.errors ?? []).map((e) => ({ path: `/body${e.instancePath}`, message: e.message ?? 'is not valid' })),
      );
    return known as VoiceOptions;
  };
}

const tooLarge = (limit: number) => new PayloadTooLargeError(`the audio is over the ${Math.round(limit / 1024 / 1024)} MB limit`);

/** What is left of a refused body is drained, unread, and the connection closed after the answer. */
function stopReading(req: Request, res: Response): void {
  req.unpipe();
  req.resume();
  res.setHeader('Connection', 'close');
}

function readUpload(req: Request, res: Response, limit: number): Promise<Upload> {
  return req.is('multipart/form-data') ? readMultipart(req, res, limit) : readRaw(req, res, limit);
}

function readRaw(req: Request, res: Response, limit: number): Promise<Upload> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        req.off('data', onData);
        req.off('end', onEnd);
        stopReading(req, res);
        reject(tooLarge(limit));
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = () => resolve({ bytes: Buffer.concat(chunks, size), fields: {} });
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', reject);
  });
}

function readMultipart(req: Request, res: Response, limit: number): Promise<Upload> {
  return new Promise((resolve, reject) => {
    let bb: busboy.Busboy;
    try {
      bb = busboy({ headers: req.headers, limits: { files: 1, fields: 32, fieldSize: MAX_FIELD_BYTES, fileSize: limit } });
    } catch (err) {
      reject(new ValidationError('the multipart body cannot be read', [{ path: '/body', message: (err as Error).message }]));
      return;
    }
    const fields: Record<string, string> = Object.create(null);
    const upload: Partial<Upload> = { fields };
    let settled = false;
    const fail = (err: Error) => {
      if (settled) return;
      settled = true;
      stopReading(req, res);
      reject(err);
    };
    bb.on('file', (name, file, info) => {
      if (name !== 'file') {
        file.resume();
        return;
      }
      const chunks: Buffer[] = [];
      file.on('data', (c: Buffer) => chunks.push(c));
      file.on('limit', () => fail(tooLarge(limit)));
      file.on('end', () => {
        upload.bytes = Buffer.concat(chunks);
        upload.filename = info.filename;
      });
    });
    bb.on('field', (name, value, info) => {
      if (info.valueTruncated)
        fail(new ValidationError('a field is too long', [{ path: `/body/${name}`, message: `must be at most ${MAX_FIELD_BYTES} bytes` }]));
      else if (value) fields[name] = value;
    });
    bb.on('error', (err: Error) => fail(new ValidationError('the multipart body cannot be read', [{ path: '/body', message: err.message }])));
    bb.on('close', () => {
      if (settled) return;
      if (!upload.bytes) return fail(new ValidationError('no audio', [{ path: '/body/file', message: 'a file field named "file" is required' }]));
      settled = true;
      resolve(upload as Upload);
    });
    req.pipe(bb);
  });
}

// /api/v1/autonomy/voice/transcribe: hands the audio (multipart `file`, or the raw body) to the engine as
// it streams in; the engine judges it, counts it against the limit and passes it on to the provider.
// Nothing is stored; the text may then become a session message or an autonomy run's goal.
import type { Readable } from 'node:stream';
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import busboy from 'busboy';
import { Router, type Request, type Response } from 'express';
import { AudioRejectedError, ConflictError, MESSAGE_TEXT_MAX, PayloadTooLargeError, ValidationError } from '../../engine/platform/index.js';
import type { Engine } from '../../engine/index.js';
import { tenantOf } from '../auth.js';
import type { components } from '../schema.js';
import type { OpenApiDocument } from '../spec.js';
import { autonomyRunRequest, type AutonomyWork } from './autonomy.js';
import { acceptedRun, acceptRun, idempotencyKeyOf } from './runs.js';

/** The transcript, and what it became: the run's view is the one every 202 carries. */
type Answer = Omit<components['schemas']['Transcription'], 'run'> & { run?: ReturnType<typeof acceptedRun> };
type VoiceOptions = Omit<components['schemas']['TranscriptionUpload'], 'file'>;

const MAX_FIELD_BYTES = 4096;
const MAX_FIELDS = 32;
/** The longest goal a run takes (AutonomyRunRequest.goal). */
const MAX_GOAL_CHARS = 20_000;

export function voiceRouter(engine: Engine, spec: OpenApiDocument): Router {
  const router = Router();
  const optionsOf = fieldValidator(spec);

  router.post('/voice/transcribe', async (req: Request, res: Response) => {
    engine.voice.assertConfigured();
    const tenantId = tenantOf(req);
    const incoming = receive(req, engine.voice.maxBytes);
    // a retry of a spoken run answers the run its key started, as `POST /autonomy/run` does, even when a new
    // request would now be refused (the tenant's line full, its session archived since): those checks are
    // skipped for it. A session that is not the caller's is still refused: the key proves nothing about it.
    const key = idempotencyKeyOf(req);
    const held = key ? await engine.runs.heldRun(tenantId, key) : null;
    const replaying = held !== null;
    const assertCanTake = async (o: VoiceOptions) => {
      if (o.session_id)
        await engine.sessions.assertCanPost(tenantId, o.session_id, o.to).catch((err: unknown) => {
          if (!(replaying && o.run && err instanceof ConflictError)) throw err;
        });
      if (o.run && !replaying) await engine.runs.assertAcceptable(tenantId, autonomyRunRequest(req, 'autonomy', spokenRun('…', o.workspace)));
    };
    let opts: VoiceOptions = {};
    // once every byte is here, before the provider gets the last of them: a raw body's options are query
    // parameters (checked by the validator), a form's are its fields (which may follow its file)
    const complete = async (sha256: string | null) => {
      opts = { ...(req.query as VoiceOptions), ...optionsOf(await incoming.fields) };
      if (opts.to && !opts.session_id) throw new ValidationError('`to` names an agent of a session', [{ path: '/body/to', message: 'needs session_id' }]);
      if (opts.workspace && !opts.run) throw new ValidationError('`workspace` is where a run starts', [{ path: '/body/workspace', message: 'needs run=true' }]);
      // a key that started a run for another request (other audio, session, agent or workspace) is refused as
      // `createIdempotent` refuses it, before the provider has the last of the audio: no transcript is paid for
      if (held && opts.run) held.assertSame(spokenFingerprint(sha256, opts));
      // a session that is not there, not the caller's or archived, or a run that would be refused: the provider is not paid
      await assertCanTake(opts);
      return { language: opts.language, prompt: opts.prompt };
    };

    const aborted = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) aborted.abort();
    });
    let heard: Awaited<ReturnType<Engine['voice']['transcribe']>>;
    try {
      // options in the query are known now: a foreign session or a refused run does not wait for the upload
      await assertCanTake(req.query as VoiceOptions);
      // so are a form's fields ahead of its file, once the file is announced: they are checked before the
      // engine sends a byte of the audio to the provider, which must not hear a recording meant for another
      // tenant's session (or an archived one)
      const { audio, before } = await incoming.file;
      const ahead = optionsOf(before);
      if (Object.keys(ahead).length) await assertCanTake({ ...(req.query as VoiceOptions), ...ahead });
      heard = await engine.voice.transcribe(tenantId, audio, {
        signal: aborted.signal,
        log: req.log,
        complete,
        // a form's run field is read only at the end: any request with a key is fingerprinted
        digest: !!key,
      });
    } catch (err) {
      // what is left of a refused body is drained, unread, and the connection closed after the answer
      if (!req.complete) {
        req.unpipe();
        req.resume();
        res.setHeader('Connection', 'close');
      }
      throw err;
    }
    const out: Answer = heard.transcript;
    if (!opts.session_id && !opts.run) {
      res.json(out);
      return;
    }
    const text = out.text.trim();
    const silent = () => new AudioRejectedError('audio-invalid', 'no words were recognised in the audio; nothing was posted or started');
    const post = async () => {
      // (the engine refuses it too, under the message's own path)
      if (opts.session_id && [...text].length > MESSAGE_TEXT_MAX)
        throw new ValidationError('the transcript is too long to be a message', [
          { path: '/body/session_id', message: `a message's text is at most ${MESSAGE_TEXT_MAX} characters` },
        ]);
      // with the run's Idempotency-Key: a retry of a request that posted it, and then could not store its run, posts it once
      if (opts.session_id)
        out.message = await engine.sessions.postMessage(
          tenantId,
          opts.session_id,
          { role: 'user', to: opts.to, parts: [{ type: 'text', text }] },
          opts.run && key ? `voice-run:${key}` : undefined,
        );
    };
    if (!opts.run) {
      if (!text) throw silent();
      await post();
      res.json(out);
      return;
    }
    // a retry with the same key and the same audio (and the same session and agent) returns the run the first
    // one started, whatever the provider hears the second time, and posts nothing again: the message is
    // posted, and the transcript judged, only for a new key
    const { run, replayed } = await engine.runs.createIdempotent(tenantId, key, spokenFingerprint(heard.sha256, opts), async () => {
      if (!text) throw silent();
      if (text.length > MAX_GOAL_CHARS)
        throw new ValidationError('the transcript is too long to be a run goal', [
          { path: '/body/run', message: `a goal is at most ${MAX_GOAL_CHARS} characters` },
        ]);
      const request = autonomyRunRequest(req, 'autonomy', spokenRun(text, opts.workspace));
      // what would refuse the run refuses it before the message is posted (the line may have filled while the
      // provider worked): a refused request posts nothing, so its retry posts the message once, not twice
      await engine.runs.assertAcceptable(tenantId, request);
      await post();
      return request;
    });
    out.run = acceptedRun(engine, run);
    acceptRun(res, engine, run, replayed, out);
  });

  return router;
}

/** What a spoken run's Idempotency-Key is held to: the recording (its sha256), and where the run and its message go. */
const spokenFingerprint = (sha256: string | null, o: VoiceOptions) => ({
  kind: 'autonomy',
  voice: sha256,
  workspace: o.workspace ?? null,
  session_id: o.session_id ?? null,
  to: o.to ?? null,
});

/** The run a recording starts: its text as the goal, the defaults of `POST /autonomy/run` otherwise. */
const spokenRun = (goal: string, workspace: string | undefined): AutonomyWork => ({ goal, workspace, network: false, gates: false });

/** Checks a form's option fields against the spec's TranscriptionUpload (`run` from "true"/"false"); other fields are ignored. */
function fieldValidator(spec: OpenApiDocument): (fields: Record<string, string>) => VoiceOptions {
  const components = spec.components as { schemas: Record<string, { properties: Record<string, unknown> }> };
  const { file: _file, ...properties } = components.schemas.TranscriptionUpload!.properties;
  const names = Object.keys(properties);
  // compiled for the first form (at the router's making it took 70 ms of each web process's start)
  let validate: ValidateFunction | undefined;
  return (fields) => {
    validate ??= new Ajv2020({ allErrors: true, strict: false, coerceTypes: true }).compile({ type: 'object', properties, components });
    const known: Record<string, unknown> = Object.fromEntries(Object.entries(fields).filter(([k]) => names.includes(k)));
    if (!validate(known))
      throw new ValidationError(
        'a form field is not valid',
        (validate.errors ?? []).map((e) => ({ path: `/body${e.instancePath}`, message: e.message ?? 'is not valid' })),
      );
    return known as VoiceOptions;
  };
}

/**
 * What a form may hold besides its audio: every field at its limit, and each part's headers and boundary
 * (busboy reads at most 16 KB of a part's headers).
 */
const MAX_FORM_OVERHEAD_BYTES = MAX_FIELDS * MAX_FIELD_BYTES + (MAX_FIELDS + 1) * 16 * 1024;

/**
 * The audio as it streams in (a form's `file`, with the fields that came before it, or the raw body), and a
 * form's fields once it has been read.
 */
function receive(
  req: Request,
  maxAudioBytes: number,
): { file: Promise<{ audio: Readable; before: Record<string, string> }>; fields: Promise<Record<string, string>> } {
  const refused = (err: Error) => {
    const bad = Promise.reject(err);
    bad.catch(() => undefined);
    return { file: bad, fields: bad };
  };
  if (!req.is('multipart/form-data')) {
    // a raw body whose length says it is over the limit is refused before a byte of it reaches the provider
    if (Number(req.headers['content-length']) > maxAudioBytes)
      return refused(new PayloadTooLargeError(`the audio is over the ${Math.round(maxAudioBytes / 1024 / 1024)} MB limit`));
    return { file: Promise.resolve({ audio: req, before: {} }), fields: Promise.resolve({}) };
  }
  const unreadable = (err: Error) => new ValidationError('the multipart body cannot be read', [{ path: '/body', message: err.message }]);
  const noAudio = () => new ValidationError('no audio', [{ path: '/body/file', message: 'a file field named "file" is required' }]);
  const fields: Record<string, string> = Object.create(null);
  // the engine counts the audio, but not what a form carries besides it (a part the route ignores, a field
  // busboy truncates but reads whole): the whole body is capped, so nothing holds an upload slot for long
  const maxBodyBytes = maxAudioBytes + MAX_FORM_OVERHEAD_BYTES;
  const tooLarge = () =>
    new PayloadTooLargeError(`the form is over its limit of ${maxBodyBytes} bytes (${Math.round(maxAudioBytes / 1024 / 1024)} MB of audio and its fields)`);
  let bb: busboy.Busboy;
  try {
    bb = busboy({ headers: req.headers, limits: { files: 1, fields: MAX_FIELDS, fieldSize: MAX_FIELD_BYTES } });
    if (Number(req.headers['content-length']) > maxBodyBytes) throw tooLarge();
  } catch (err) {
    return refused(err instanceof PayloadTooLargeError ? err : unreadable(err as Error));
  }
  let failure: Error | undefined;
  let audio: Readable | undefined;
  let settleFile: { resolve: (got: { audio: Readable; before: Record<string, string> }) => void; reject: (err: Error) => void };
  let settleFields: { resolve: (got: Record<string, string>) => void; reject: (err: Error) => void };
  const file = new Promise<{ audio: Readable; before: Record<string, string> }>((resolve, reject) => (settleFile = { resolve, reject }));
  const done = new Promise<Record<string, string>>((resolve, reject) => (settleFields = { resolve, reject }));
  file.catch(() => undefined);
  done.catch(() => undefined);
  // a form refused part way is not read further: the route answers at once and closes the connection, and
  // what busboy would drop quietly is refused too (a field past the limit may be session_id or run)
  const refuse = (err: Error) => {
    if (failure) return;
    failure = err;
    settleFile.reject(err);
    settleFields.reject(err);
    req.unpipe(bb);
    audio?.destroy(err);
    // busboy is left to finish the chunk it is parsing, which may be the one that announced the part
    process.nextTick(() => bb.destroy());
  };
  bb.on('file', (name, stream) => {
    // busboy may break a part off in the same turn it is announced: nothing is left to throw it
    stream.on('error', () => undefined);
    // a second file is announced as busboy's `filesLimit`, below
    if (name !== 'file') refuse(noAudio());
    else settleFile.resolve({ audio: (audio = stream), before: { ...fields } });
  });
  bb.on('field', (name, value, info) => {
    if (info.valueTruncated)
      refuse(new ValidationError('a field is too long', [{ path: `/body/${name}`, message: `must be at most ${MAX_FIELD_BYTES} bytes` }]));
    else if (value) fields[name] = value;
  });
  bb.on('fieldsLimit', () => refuse(new ValidationError('too many fields', [{ path: '/body', message: `at most ${MAX_FIELDS} fields` }])));
  bb.on('filesLimit', () => refuse(new ValidationError('more than one file', [{ path: '/body', message: 'send one file, named "file"' }])));
  bb.on('close', () => {
    settleFile.reject(noAudio());
    settleFields.resolve(fields);
  });
  bb.on('error', (err: Error) => {
    settleFile.reject(unreadable(err));
    settleFields.reject(unreadable(err));
  });
  let read = 0;
  req.on('data', (chunk: Buffer) => {
    read += chunk.length;
    if (read > maxBodyBytes) refuse(tooLarge());
  });
  // a client that goes away mid-form ends neither the form nor its file: both are broken off
  req.once('close', () => {
    if (req.complete) return;
    const gone = new Error('the client went away before the form ended');
    audio?.destroy(gone);
    bb.destroy(gone);
  });
  req.pipe(bb);
  return { file, fields: done };
}

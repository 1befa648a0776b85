// /api/v1/autonomy/voice/transcribe: reads the audio (multipart `file`, or the raw body) as it streams,
// counting bytes and stopping at the limit, then hands it to the engine. Nothing is stored.
import busboy from 'busboy';
import { Router, type Request, type Response } from 'express';
import { PayloadTooLargeError, ValidationError } from '../../engine/platform/index.js';
import type { Engine } from '../../engine/index.js';
import { tenantOf } from '../auth.js';
import type { components } from '../schema.js';

type Transcription = components['schemas']['Transcription'];
type Upload = { bytes: Buffer; filename?: string; language?: string; prompt?: string };

const MAX_FIELD_BYTES = 4096;

export function voiceRouter(engine: Engine): Router {
  const router = Router();

  router.post('/voice/transcribe', async (req: Request, res: Response) => {
    engine.voice.assertConfigured();
    const upload = await readUpload(req, res, engine.voice.maxBytes);
    const aborted = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) aborted.abort();
    });
    const out: Transcription = await engine.voice.transcribe(tenantOf(req), upload, {
      language: upload.language,
      prompt: upload.prompt,
      signal: aborted.signal,
      log: req.log,
    });
    res.json(out);
  });

  return router;
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
    const onEnd = () => resolve({ bytes: Buffer.concat(chunks, size) });
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', reject);
  });
}

function readMultipart(req: Request, res: Response, limit: number): Promise<Upload> {
  return new Promise((resolve, reject) => {
    let bb: busboy.Busboy;
    try {
      bb = busboy({ headers: req.headers, limits: { files: 1, fields: 8, fieldSize: MAX_FIELD_BYTES, fileSize: limit } });
    } catch (err) {
      reject(new ValidationError('the multipart body cannot be read', [{ path: '/body', message: (err as Error).message }]));
      return;
    }
    const upload: Partial<Upload> = {};
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
      else if (name === 'language' && value) upload.language = value;
      else if (name === 'prompt' && value) upload.prompt = value;
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

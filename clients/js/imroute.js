// imroute's browser client: one ES module, no dependencies, no build step. The push
// service serves it at /client/imroute.js.
//
//   import { ImrouteClient } from "/client/imroute.js";
//   const c = new ImrouteClient({ apiUrl, token, onMessage, onRecovered });
//   await c.connect();   // resolves once caught up (the first `recovered` frame)
//   c.close();
//
// The same semantics as the Python SDK (clients/python):
// - it asks GET /v1/dispatch which gateway to use, with the token as a Bearer header;
// - the token travels in Sec-WebSocket-Protocol (`imroute.jwt.<token>` beside
//   `imroute.v1`), never in the URL;
// - it resumes with `?since=<pos>`: the position of the last push the app finished with;
// - onMessage(frame) is called once per push, in order; a msg_id seen among the last
//   `dedupeWindow` is dropped (a replay after a reconnect, a retried delivery);
// - acks are cumulative: once the app is done with a push, `{"type":"ack","pos":...}`
//   is sent on the connection it came on, at most one per `ackIntervalMs` (the latest);
// - it sends `{"type":"ping"}` every `pingIntervalMs` (20 s) and takes a connection from
//   which nothing came for a whole interval after a ping as lost (a NAT that dropped it,
//   a laptop that slept: no close ever arrives), and reconnects;
// - a connection that ends is retried with jittered exponential backoff: the same
//   gateway for a network error (`retriesSame` times), another through dispatch for a
//   drain (a `reconnect` frame, 4503), a full gateway (a refused handshake, which a
//   browser sees as 1006), or once the retries are spent; the user's connection cap
//   (4429) waits at least 5 s first;
// - a connection that never opened (unreachable, or refused: a browser cannot tell) is
//   reported to dispatch as `?avoid=<gateway_id>`: it names another gateway when it can;
// - a dispatch that gets no answer, a 5xx or a 429 is asked again after a backoff (its
//   Retry-After), each failure told to onState("reconnecting", {error, delayMs}) and
//   counted in stats.dispatchErrors; a browser reports a push service on another origin
//   that does not list the page's (IMROUTE_CORS_ORIGINS) as it does a network error;
// - a refused token (dispatch's 401) stops it: connect() rejects, and onError receives
//   an UnauthorizedError.

export const CLOSE_FULL = 4429;
export const CLOSE_DRAIN = 4503;
const USER_CAP_REASON = "too many connections for this user";
const USER_CAP_WAIT_MS = 5000;

export class UnauthorizedError extends Error {
  constructor(message) {
    super(message);
    this.name = "UnauthorizedError";
  }
}

/** min * 2^attempt, capped at max, times a jitter in [0.5, 1.5). */
export function backoffMs(attempt, minMs = 100, maxMs = 5000, rand = Math.random) {
  const base = Math.min(maxMs, minMs * 2 ** Math.min(Math.max(attempt, 0), 64));
  return Math.min(maxMs, base * (0.5 + rand()));
}

/** The last `size` msg_ids, in arrival order. */
export class DedupeWindow {
  constructor(size = 10000) {
    this.size = size;
    this.seen = new Set();
    this.order = [];
  }
  /** True the first time `id` is offered (within the window). */
  add(id) {
    if (this.seen.has(id)) return false;
    this.seen.add(id);
    this.order.push(id);
    if (this.order.length > this.size) this.seen.delete(this.order.shift());
    return true;
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const PING = JSON.stringify({ type: "ping" });

export class ImrouteClient {
  constructor({
    apiUrl,
    token,
    onMessage = () => {},
    onRecovered = () => {},
    onError = () => {},
    onState = () => {},
    since = null,
    dedupeWindow = 10000,
    ackIntervalMs = 100,
    backoffMinMs = 100,
    backoffMaxMs = 5000,
    stableMs = 5000,
    retriesSame = 2,
    pingIntervalMs = 20000,
    WebSocketImpl = globalThis.WebSocket,
    fetchImpl = globalThis.fetch.bind(globalThis),
  }) {
    if (!apiUrl || !token) throw new TypeError("ImrouteClient needs apiUrl and token");
    Object.assign(this, { apiUrl: apiUrl.replace(/\/+$/, ""), token, onMessage, onRecovered,
      onError, onState, ackIntervalMs, backoffMinMs, backoffMaxMs, stableMs, retriesSame,
      pingIntervalMs, WebSocketImpl, fetchImpl });
    this.pos = since;  // the last push the app finished with; `since` on a reconnect
    this.dedupe = new DedupeWindow(dedupeWindow);
    this.stats = { connects: 0, pushes: 0, duplicates: 0, acks: 0, recovered: 0, dispatches: 0,
      dispatchErrors: 0, avoided: 0, silent: 0 };
    this.gateway = null;  // {ws_url, gateway_id, group_id} of the current connection
    this._closed = false;
    this._ws = null;
    this._queue = Promise.resolve();  // pushes handed to the app one at a time, in order
    this._ackTimer = null;
    this._pinger = null;  // the current connection's pings
    this._ackPos = null;
    this._failures = 0;
    this._sameTries = 0;
    this._ready = null;
  }

  /** Connect (and keep reconnecting) until close(); resolves at the first `recovered`
   * frame, rejects if the token is refused. */
  connect() {
    if (!this._ready) {
      this._ready = new Promise((resolve, reject) => {
        this._resolveReady = resolve;
        this._rejectReady = reject;
      });
      this._run();
    }
    return this._ready;
  }

  /** Stop for good: the connection is closed (1000) and nothing is retried. */
  close() {
    this._closed = true;
    clearInterval(this._pinger);
    this._flushAck();
    if (this._ws) this._ws.close(1000, "client closed");
    if (this._resolveReady) {  // connect() is still waiting: it will not connect now
      this._resolveReady = null;
      this._rejectReady(new Error("closed before it connected"));
    }
    this._state("closed");
  }

  /** onState, whose error is the app's: said to onError, and the client goes on. */
  _state(state, detail) {
    try {
      this.onState(state, detail);
    } catch (e) {
      this.onError(e);
    }
  }

  async _run() {
    let target = null;
    let avoid = null;  // the gateway the last connection failed to open on
    while (!this._closed) {
      try {
        if (target === null) target = await this._dispatch(avoid);
      } catch (e) {
        return this._stop(e);
      }
      if (this._closed) return;
      const started = Date.now();
      const end = await this._session(target);
      if (this._closed) return;
      const step = this._next(end, Date.now() - started);
      avoid = end.opened ? null : target.gateway_id;
      if (step.dispatch) target = null;
      this._state("reconnecting", { code: end.code, delayMs: step.delayMs });
      await sleep(step.delayMs);
    }
  }

  _stop(error) {
    this._closed = true;
    this.onError(error);
    if (this._rejectReady) this._rejectReady(error);
    this._state("stopped", { error });
  }

  /** What to do after a connection ended (the Python SDK's policy.next_step). */
  _next(end, livedMs) {
    if (livedMs >= this.stableMs) {
      this._failures = 0;
      this._sameTries = 0;
    }
    const delay = this._failures ? backoffMs(this._failures - 1, this.backoffMinMs, this.backoffMaxMs) : 0;
    this._failures += 1;
    if (end.userCap) {
      this._sameTries = 0;
      return { dispatch: true, delayMs: Math.max(delay, USER_CAP_WAIT_MS) };
    }
    if (end.move) {
      this._sameTries = 0;
      return { dispatch: true, delayMs: delay };
    }
    const wait = Math.max(delay, backoffMs(0, this.backoffMinMs, this.backoffMaxMs));
    if (end.transport && this._sameTries < this.retriesSame) {
      this._sameTries += 1;
      return { dispatch: false, delayMs: wait };
    }
    this._sameTries = 0;
    return { dispatch: true, delayMs: wait };
  }

  /** GET /v1/dispatch until it names a gateway (not `avoid` if it has another), or
   * null once closed; UnauthorizedError on 401. */
  async _dispatch(avoid = null) {
    const query = avoid ? `?avoid=${encodeURIComponent(avoid)}` : "";
    if (avoid) this.stats.avoided += 1;
    for (let attempt = 0; !this._closed; attempt++) {
      this.stats.dispatches += 1;
      let wait = null;
      let error;
      try {
        const resp = await this.fetchImpl(`${this.apiUrl}/v1/dispatch${query}`, {
          headers: { Authorization: `Bearer ${this.token}` },
        });
        error = new Error(`dispatch answered ${resp.status}`);
        if (resp.status === 200) {
          const body = await resp.json();
          if (body && typeof body.ws_url === "string") return body;
          error = new Error("dispatch answered 200 without a ws_url");
        } else if (resp.status === 401) {
          throw new UnauthorizedError(`dispatch refused the token (401)`);
        } else if (resp.status < 500 && resp.status !== 429) {
          throw new Error(`dispatch answered ${resp.status}`);
        }
        const after = Number(resp.headers.get("Retry-After"));
        if (Number.isFinite(after) && after > 0) {
          // Clamped and jittered (up to 20 % more), as the Python SDK does.
          const clamped = Math.min(Math.max(after * 1000, this.backoffMinMs), this.backoffMaxMs);
          wait = Math.min(this.backoffMaxMs, clamped * (1 + 0.2 * Math.random()));
        }
      } catch (e) {
        if (e instanceof UnauthorizedError || (e instanceof Error && e.message.startsWith("dispatch answered"))) throw e;
        error = e;  // no answer: the network, or a push service on another origin that
        // does not list this page's (IMROUTE_CORS_ORIGINS): a browser cannot tell them apart
      }
      if (this._closed) break;  // closed while it asked: nothing to say
      this.stats.dispatchErrors += 1;
      const delayMs = wait ?? backoffMs(attempt, this.backoffMinMs, this.backoffMaxMs);
      this._state("reconnecting", { error, delayMs });
      await sleep(delayMs);
    }
    return null;  // closed: _run stops without an error
  }

  /** One connection, until it ends: how it ended. */
  _session(target) {
    return new Promise((resolve) => {
      const url = this.pos ? `${target.ws_url}${target.ws_url.includes("?") ? "&" : "?"}since=${encodeURIComponent(this.pos)}` : target.ws_url;
      let ws;
      try {
        ws = new this.WebSocketImpl(url, ["imroute.v1", `imroute.jwt.${this.token}`]);
      } catch (e) {
        // A URL or token the browser refuses to open (a SyntaxError): said, and tried
        // again through dispatch after a backoff, as a connection that never opened.
        this.onError(e);
        resolve({ code: 1006, opened: false, userCap: false, move: true,
                  transport: false });
        return;
      }
      this._ws = ws;
      this.gateway = target;
      let opened = false;
      let told = false;
      let heard = true;  // anything received since the last ping
      const ended = (end) => {
        clearInterval(this._pinger);
        if (this._ws === ws) this._ws = null;
        clearTimeout(this._ackTimer);
        this._ackTimer = null;
        resolve(end);
      };
      ws.onopen = () => {
        opened = true;
        this.stats.connects += 1;
        this._state("connected", { gateway: target.gateway_id });
        this._pinger = setInterval(() => {
          if (!heard) {
            // Nothing came for a whole interval after a ping: the connection is gone,
            // though no close may ever arrive. Lost, as a network error is.
            this.stats.silent += 1;
            ws.onclose = null;
            ws.close();
            ended({ code: 1006, opened: true, userCap: false,
                    move: told, transport: true });
            return;
          }
          heard = false;
          if (ws.readyState === 1) ws.send(PING);
        }, this.pingIntervalMs);
      };
      ws.onmessage = (event) => {
        heard = true;
        let frame;
        try {
          frame = JSON.parse(event.data);
        } catch {
          return;  // not ours to judge: the gateway only sends JSON
        }
        if (frame.type === "push") this._push(ws, frame);
        else if (frame.type === "recovered") this._recovered(frame);
        else if (frame.type === "reconnect") told = true;
      };
      ws.onclose = (event) => {
        const code = event.code;
        const reason = event.reason || "";
        ended({
          code,
          opened,
          userCap: code === CLOSE_FULL && reason.startsWith(USER_CAP_REASON),
          // A refused handshake (401, 429, 503) shows as 1006 before the open: dispatch
          // says which (its 401 stops the client).
          move: told || code === CLOSE_DRAIN || !opened,
          transport: opened && code === 1006,
        });
      };
    });
  }

  _push(ws, frame) {
    this._queue = this._queue.then(async () => {
      if (this.dedupe.add(frame.msg_id)) {
        this.stats.pushes += 1;
        try {
          await this.onMessage(frame);
        } catch (e) {
          this.onError(e);  // the app's error: the push still counts as handled
        }
      } else {
        this.stats.duplicates += 1;
      }
      if (typeof frame.pos === "string" && frame.pos) {  // else the last one still holds
        this.pos = frame.pos;
        this._ack(ws, frame.pos);
      }
    });
  }

  _recovered(frame) {
    this._queue = this._queue.then(async () => {
      this.stats.recovered += 1;
      try {
        await this.onRecovered(frame);
      } catch (e) {
        this.onError(e);
      }
      if (this._resolveReady) {
        this._resolveReady(frame);
        this._resolveReady = null;
      }
    });
  }

  /** Cumulative: the latest position, at most once per ackIntervalMs, on `ws` only. */
  _ack(ws, pos) {
    if (ws !== this._ws) return;  // that connection is gone: the next resume covers it
    this._ackPos = pos;
    if (this._ackTimer === null) {
      this._ackTimer = setTimeout(() => this._flushAck(), this.ackIntervalMs);
    }
  }

  _flushAck() {
    clearTimeout(this._ackTimer);
    this._ackTimer = null;
    const ws = this._ws;
    if (this._ackPos && ws && ws.readyState === 1) {
      ws.send(JSON.stringify({ type: "ack", pos: this._ackPos }));
      this.stats.acks += 1;
    }
    this._ackPos = null;
  }
}

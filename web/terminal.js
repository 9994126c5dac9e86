/*
 * terminal.js - warrend's browser terminal: xterm.js on the PTY WebSocket
 * "warren.pty.v1" (docs/API.md, "PTY WebSocket").
 *
 * Page URL: /terminal/{sandbox id}?token=T&pid=N&offset=O&cmd=C&cwd=D, all optional.
 * Without pid it opens a new PTY (GET /v1/sandboxes/{id}/pty) and then writes
 * the pid it got into the address bar, so a reload re-attaches to the same
 * shell (/pty/{pid}) and replays its output from the ring.
 *
 * Invariants:
 * - `next` is the output offset after the last byte handed to xterm.js. A
 *   reconnect asks for exactly that offset, so the joined output has no gap
 *   and no duplicate; bytes a server repeats below `next` are skipped.
 * - Flow control: an output frame is acknowledged (ACK) only from xterm.js's
 *   write callback, i.e. once it has been parsed and drawn. The server sends
 *   at most one window (1 MiB) ahead of the ACKs, so a flood such as `yes`
 *   never piles up in the tab and keystrokes still get through.
 * - Each socket has a generation; callbacks of an older socket (a late write
 *   callback, a close) do nothing, so ACKs never reach the wrong socket.
 */
(function () {
  'use strict';

  var OP_INPUT = 0x00, OP_RESIZE = 0x01, OP_ACK = 0x02;
  var OP_OUTPUT = 0x10, OP_CONTROL = 0x11;
  var INPUT_MAX = 65536;    /* payload bytes per INPUT frame (server limit) */
  var ACK_BATCH = 65536;    /* acknowledge at once past this many bytes... */
  var ACK_DELAY_MS = 10;    /* ...else after this long */
  var RETRY_MIN_MS = 250, RETRY_MAX_MS = 5000;
  var HELD_MAX = 65536;     /* keystrokes kept while (re)connecting, sent once open */

  var params = new URLSearchParams(location.search);
  var parts = location.pathname.split('/');
  var sbx = decodeURIComponent(parts[2] || '');
  var token = params.get('token') || params.get('access_token');
  var pid = /^[1-9][0-9]*$/.test(params.get('pid') || '') ? Number(params.get('pid')) : null;
  var next = /^[0-9]+$/.test(params.get('offset') || '') ? Number(params.get('offset')) : 0;

  var statusEl = document.getElementById('status');
  var enc = new TextEncoder(), dec = new TextDecoder();

  var term = new Terminal({
    cursorBlink: true,
    scrollback: 10000,
    fontFamily: 'monospace',
    fontSize: 14,
  });
  var fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(document.getElementById('term'));
  fit.fit(); /* before connecting: a new PTY starts at the window's size */
  term.focus();
  document.title = sbx + ' - Warren';

  var ws = null, gen = 0, state = 'connecting', retries = 0, retryTimer = null;
  var finished = false; /* the process exited, or the server refused us for good */
  var ackPending = 0, ackTimer = null;
  var drawing = 0; /* bytes handed to xterm.js whose write callback has not run yet */
  /* Input typed while the socket is down (a restart of warrend, a network blip): sent in
   * order once it opens again, so no keystroke is lost; past HELD_MAX the rest is dropped
   * and the page says so. */
  var held = [], heldBytes = 0, heldDropped = 0;

  function setStatus(s, text) {
    state = s;
    statusEl.dataset.state = s;
    statusEl.textContent = text || s;
  }

  /* A dim line of our own between the program's output (never counted in `next`). */
  function note(text) {
    term.write('\r\n\x1b[2m[' + text + ']\x1b[22m\r\n');
  }

  function send(op, payload) {
    if (!ws || ws.readyState !== WebSocket.OPEN)
      return false;
    var f = new Uint8Array(1 + (payload ? payload.length : 0));
    f[0] = op;
    if (payload)
      f.set(payload, 1);
    ws.send(f);
    return true;
  }

  function sendResize() {
    var b = new Uint8Array(4), dv = new DataView(b.buffer);
    dv.setUint16(0, term.cols);
    dv.setUint16(2, term.rows);
    send(OP_RESIZE, b);
  }

  function flushAck() {
    if (ackTimer) {
      clearTimeout(ackTimer);
      ackTimer = null;
    }
    if (!ackPending)
      return;
    var b = new Uint8Array(4);
    new DataView(b.buffer).setUint32(0, ackPending);
    ackPending = 0;
    send(OP_ACK, b);
  }

  function ack(g, n) {
    if (g !== gen || !n)
      return; /* that socket is gone: its window went with it */
    ackPending += n;
    if (ackPending >= ACK_BATCH)
      flushAck();
    else if (!ackTimer)
      ackTimer = setTimeout(flushAck, ACK_DELAY_MS);
  }

  function sendInput(bytes) {
    if (finished)
      return;
    if (!ws || ws.readyState !== WebSocket.OPEN || held.length) {
      var room = HELD_MAX - heldBytes, keep = bytes.length < room ? bytes.length : room;
      if (keep > 0) {
        held.push(bytes.slice(0, keep));
        heldBytes += keep;
      }
      heldDropped += bytes.length - keep;
      return;
    }
    for (var i = 0; i < bytes.length; i += INPUT_MAX)
      send(OP_INPUT, bytes.subarray(i, i + INPUT_MAX));
  }

  function flushHeld() {
    var h = held;
    held = [];
    heldBytes = 0;
    if (heldDropped) {
      note('dropped ' + heldDropped + ' bytes typed while reconnecting');
      heldDropped = 0;
    }
    h.forEach(sendInput);
  }

  term.onData(function (s) { sendInput(enc.encode(s)); });
  term.onBinary(function (s) {
    var b = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++)
      b[i] = s.charCodeAt(i) & 0xff;
    sendInput(b);
  });
  term.onResize(function () { sendResize(); });
  term.onTitleChange(function (t) { document.title = t || sbx + ' - Warren'; });

  /* Follow the window: refit at most once a frame; xterm.js reports the new size. */
  var fitQueued = false;
  function refit() {
    if (fitQueued)
      return;
    fitQueued = true;
    requestAnimationFrame(function () {
      fitQueued = false;
      fit.fit();
    });
  }
  window.addEventListener('resize', refit);
  if (window.ResizeObserver)
    new ResizeObserver(refit).observe(document.getElementById('term'));

  function url() {
    var q = new URLSearchParams(), path = '/v1/sandboxes/' + encodeURIComponent(sbx) + '/pty';
    if (pid !== null) {
      path += '/' + pid;
      q.set('offset', String(next));
    } else {
      q.set('cols', String(term.cols));
      q.set('rows', String(term.rows));
      if (params.get('cmd'))
        q.set('cmd', params.get('cmd'));
      if (params.get('cwd'))
        q.set('cwd', params.get('cwd'));
    }
    if (token)
      q.set('access_token', token);
    return (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + path + '?' + q;
  }

  /* The address bar names the PTY, so a reload comes back to it (from offset 0: the whole
   * ring is replayed). The token stays; what only served to create it goes. */
  function rememberPid() {
    var u = new URL(location.href);
    u.searchParams.set('pid', String(pid));
    ['offset', 'cmd', 'cwd'].forEach(function (k) { u.searchParams.delete(k); });
    history.replaceState(null, '', u.toString());
  }

  function onControl(m) {
    switch (m.type) {
    case 'hello':
      if (pid === null) {
        pid = m.pid;
        rememberPid();
      }
      /* Attached to a PTY of another size: it takes this window's. */
      if (m.cols !== term.cols || m.rows !== term.rows)
        sendResize();
      break;
    case 'lost':
      note('lost ' + m.bytes + ' bytes of output');
      if (m.offset + m.bytes > next)
        next = m.offset + m.bytes;
      break;
    case 'exit':
      finished = true;
      note(m.signal !== null && m.signal !== undefined ? 'process killed by signal ' + m.signal
                                                       : 'process exited with code ' + m.exit_code);
      break;
    case 'error':
      note('error: ' + m.code + ': ' + m.message);
      /* Retrying cannot fix these. */
      if (/not_found|unauthorized|forbidden|expired|bad_request|invalid/.test(String(m.code)))
        finished = true;
      break;
    }
  }

  function onOutput(g, bytes) {
    if (bytes.length < 9)
      return;
    var off = Number(new DataView(bytes.buffer, bytes.byteOffset, 9).getBigUint64(1));
    var data = bytes.subarray(9), n = data.length;
    if (off + n <= next) {
      ack(g, n); /* all of it is on screen already */
      return;
    }
    if (off < next)
      data = data.subarray(next - off);
    else if (off > next)
      note('missing ' + (off - next) + ' bytes of output');
    next = off + n;
    drawing += data.length;
    term.write(data, function () {
      drawing -= data.length;
      ack(g, n);
    });
  }

  function retry() {
    var delay = Math.min(RETRY_MAX_MS, RETRY_MIN_MS * Math.pow(2, retries));
    retries++;
    setStatus('reconnecting', 'reconnecting (' + retries + ')');
    retryTimer = setTimeout(connect, delay);
  }

  /* A browser is not told why a handshake was refused. warrend answers a plain GET of
   * the socket's address with the same checks: 426 means the socket would open (a
   * passing failure: retry); 401, 403, 404 or 409 will not change by retrying (a bad or
   * expired token, a foreign Origin, an unknown or ended sandbox), so say it and stop. */
  function probe(g) {
    fetch(url().replace(/^ws/, 'http'), {cache: 'no-store'}).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (body) {
        if (g !== gen)
          return;
        if ([401, 403, 404, 409].indexOf(r.status) >= 0) {
          finished = true;
          var why = (body.error && body.error.message) || ('HTTP ' + r.status);
          note('refused: ' + why);
          setStatus('closed', 'refused: ' + why);
          return;
        }
        retry();
      });
    }, function () {
      if (g === gen)
        retry(); /* warrend is not answering at all: it may be restarting */
    });
  }

  function connect() {
    retryTimer = null;
    var g = ++gen, opened = false;
    ackPending = 0;
    setStatus(retries ? 'reconnecting' : 'connecting');
    ws = new WebSocket(url(), 'warren.pty.v1');
    ws.binaryType = 'arraybuffer';
    ws.onopen = function () {
      if (g !== gen)
        return;
      retries = 0;
      opened = true;
      setStatus('open');
      flushHeld();
    };
    ws.onmessage = function (ev) {
      if (g !== gen || !(ev.data instanceof ArrayBuffer))
        return;
      var b = new Uint8Array(ev.data);
      if (!b.length)
        return;
      if (b[0] === OP_OUTPUT) {
        onOutput(g, b);
      } else if (b[0] === OP_CONTROL) {
        try {
          onControl(JSON.parse(dec.decode(b.subarray(1))));
        } catch (e) {
          note('bad control frame');
        }
      }
    };
    ws.onclose = function (ev) {
      if (g !== gen)
        return;
      ws = null;
      /* 1008/1009: the server refused our frames; a retry would only repeat that. */
      if (ev.code === 1008 || ev.code === 1009) {
        finished = true;
        note('closed by the server: ' + (ev.reason || ev.code));
      }
      if (finished) {
        setStatus('closed');
        return;
      }
      if (!opened)
        probe(g);
      else
        retry();
    };
  }

  /* For tests and debugging: nothing here is needed by the page itself. */
  window.warrenTerminal = {
    term: term,
    get pid() { return pid; },
    get offset() { return next; },
    get state() { return state; },
    get drawing() { return drawing; },
    get held() { return heldBytes; },
    text: function () {
      var buf = term.buffer.active, lines = [];
      for (var i = 0; i < buf.length; i++)
        lines.push(buf.getLine(i).translateToString(true));
      return lines.join('\n');
    },
  };

  if (!sbx) {
    setStatus('closed', 'no sandbox id in the address');
    return;
  }
  connect();
})();

// delayd web console. Plain JavaScript, no build step: it calls the JSON
// (Connect protocol) endpoints of the HTTP listener it is served from, with
// the API key as an Authorization header. The key lives in this tab's
// sessionStorage only: never in a URL, a cookie or localStorage.
'use strict';

(() => {
  const KEY = 'delayd.apiKey';
  // Live stats: one GetNamespaceStats per namespace shown every REFRESH_MS
  // (it counts against the namespace's rate limit like any call), for at
  // most STATS_MAX namespaces of the list.
  const REFRESH_MS = 3000;
  const STATS_MAX = 200;
  const PAGE = 100;

  const main = document.getElementById('main');
  const errBox = document.getElementById('error');
  const crumbs = document.getElementById('crumbs');
  const whoami = document.getElementById('whoami');
  const signout = document.getElementById('signout');

  let me = null; // WhoAmIResponse of the signed-in key
  let timers = []; // live refreshers of the current view
  let streams = []; // AbortControllers of the current view's streams
  let gen = 0; // bumped per view; answers for an older view are dropped

  // ---- API ---------------------------------------------------------------

  class APIError extends Error {
    constructor(code, message) {
      super(message);
      this.code = code;
    }
  }

  // call makes one Connect unary call with a JSON body and returns the
  // decoded answer, or throws APIError with the server's code and message.
  async function call(method, body) {
    const headers = { 'Content-Type': 'application/json' };
    const key = sessionStorage.getItem(KEY);
    if (key) headers.Authorization = 'Bearer ' + key;
    let resp;
    try {
      resp = await fetch('/delayd.v1.' + method, {
        method: 'POST', headers, body: JSON.stringify(body || {}),
        credentials: 'omit', cache: 'no-store', referrerPolicy: 'no-referrer',
      });
    } catch (e) {
      throw new APIError('unavailable', 'delayd did not answer (' + e.message + ')');
    }
    const text = await resp.text();
    let out = {};
    try { out = text ? JSON.parse(text) : {}; } catch (_) { out = {}; }
    if (!resp.ok) {
      throw new APIError(out.code || 'http_' + resp.status, out.message || text || resp.statusText);
    }
    return out;
  }

  // watch opens a WatchDeliveries stream (Connect server streaming, JSON)
  // and calls onCopy with each copy until signal aborts or the stream ends;
  // it throws APIError when the server ends it with an error.
  async function watch(ns, signal, onCopy) {
    const body = new TextEncoder().encode(JSON.stringify({ namespace: ns }));
    const frame = new Uint8Array(5 + body.length);
    new DataView(frame.buffer).setUint32(1, body.length);
    frame.set(body, 5);
    const headers = { 'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1' };
    const key = sessionStorage.getItem(KEY);
    if (key) headers.Authorization = 'Bearer ' + key;
    let resp;
    try {
      resp = await fetch('/delayd.v1.DeliveryService/WatchDeliveries', {
        method: 'POST', headers, body: frame, signal,
        credentials: 'omit', cache: 'no-store', referrerPolicy: 'no-referrer',
      });
    } catch (e) {
      if (signal.aborted) return;
      throw new APIError('unavailable', 'delayd did not answer (' + e.message + ')');
    }
    if (!resp.ok) {
      let out = {};
      try { out = await resp.json(); } catch (_) { out = {}; }
      throw new APIError(out.code || 'http_' + resp.status, out.message || resp.statusText);
    }
    const reader = resp.body.getReader();
    let buf = new Uint8Array(0);
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (e) {
        if (signal.aborted) return;
        throw new APIError('unavailable', 'the watch stream broke (' + e.message + ')');
      }
      if (chunk.done) return;
      const joined = new Uint8Array(buf.length + chunk.value.length);
      joined.set(buf);
      joined.set(chunk.value, buf.length);
      buf = joined;
      while (buf.length >= 5) {
        const n = new DataView(buf.buffer, buf.byteOffset).getUint32(1);
        if (buf.length < 5 + n) break;
        const flags = buf[0];
        const msg = JSON.parse(new TextDecoder().decode(buf.subarray(5, 5 + n)) || '{}');
        buf = buf.slice(5 + n);
        if (flags & 2) { // end of stream
          if (msg.error) throw new APIError(msg.error.code || 'unknown', msg.error.message || '');
          return;
        }
        onCopy(msg);
      }
    }
  }

  // ---- DOM helpers ---------------------------------------------------------

  // h builds an element; strings become text nodes (never HTML), so task
  // ids, kinds and payloads cannot inject markup.
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'class') el.className = v;
      else if (k in el && typeof v !== 'string') el[k] = v;
      else el.setAttribute(k, v === true ? '' : v);
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === undefined || kid === null || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }

  function showError(err) {
    errBox.replaceChildren(
      h('span', { class: 'code' }, err.code || 'error'),
      h('span', { class: 'message' }, err.message || String(err)));
    errBox.hidden = false;
  }
  function clearError() { errBox.hidden = true; errBox.replaceChildren(); }

  // guard runs an async step of the view g and shows its error, unless the
  // view changed meanwhile.
  async function guard(g, fn) {
    try {
      await fn();
    } catch (e) {
      if (g !== gen) return;
      if (e.code === 'unauthenticated') { signOut(e); return; }
      showError(e);
      if (e.code === 'permission_denied' && denied) denied(e);
    }
  }
  let denied = null; // the current view's answer to permission_denied, if any

  function live(fn) {
    fn();
    timers.push(setInterval(fn, REFRESH_MS));
  }

  // ---- formatting ----------------------------------------------------------

  function seconds(d) { return d ? parseFloat(d) : 0; } // "1.500s"
  function fmtDuration(s) {
    if (!s) return '0 s';
    if (s < 1) return Math.round(s * 1000) + ' ms';
    if (s < 60) return s.toFixed(1) + ' s';
    const m = Math.floor(s / 60);
    if (m < 60) return m + ' min ' + Math.round(s % 60) + ' s';
    return Math.floor(m / 60) + ' h ' + (m % 60) + ' min';
  }
  function fmtTime(ts) {
    if (!ts) return '';
    const d = new Date(ts);
    return isNaN(d) ? ts : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
  }
  function num(v) { return v === undefined ? '0' : String(v); }
  function payloadText(b64) {
    if (!b64) return '';
    try {
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
    } catch (_) {
      return '(binary, base64) ' + b64;
    }
  }
  const scopeName = (s) => s.replace('KEY_SCOPE_', '').toLowerCase();

  // ---- what the key may do -------------------------------------------------

  function may(scope, ns) {
    if (!me) return false;
    const k = me.key || {};
    const onNS = k.namespace === '*' || k.namespace === ns;
    return onNS && (k.scopes || []).includes('KEY_SCOPE_' + scope);
  }
  const globalKey = () => me && me.key && me.key.namespace === '*';

  // ---- sign in / out -------------------------------------------------------

  async function signIn(secret) {
    sessionStorage.setItem(KEY, secret);
    try {
      me = await call('NamespaceService/WhoAmI', {});
    } catch (e) {
      sessionStorage.removeItem(KEY);
      me = null;
      throw e;
    }
  }

  function signOut(err) {
    sessionStorage.removeItem(KEY);
    me = null;
    if (location.hash !== '' && location.hash !== '#/') location.hash = '#/';
    render();
    if (err) showError(err);
  }
  signout.addEventListener('click', () => signOut());

  function renderHeader() {
    signout.hidden = !me || !me.authEnabled; // nothing to sign out of with authentication off
    if (!me) { whoami.replaceChildren(); return; }
    const k = me.key || {};
    whoami.replaceChildren(
      me.authEnabled ? 'key ' : 'authentication off ',
      me.authEnabled ? h('code', { id: 'whoami-key' }, k.id || '') : '',
      ' on ', h('code', { id: 'whoami-ns' }, k.namespace === '*' ? 'all namespaces' : k.namespace),
      ' · ', (k.scopes || []).map(scopeName).join(', '));
  }

  function viewSignIn() {
    const input = h('input', { id: 'key', type: 'password', autocomplete: 'off', placeholder: 'API key', required: true });
    const form = h('form', { id: 'signin', class: 'card signin' },
      h('h1', {}, 'Sign in'),
      h('p', { class: 'muted' }, 'Paste a delayd API key. It stays in this tab only (session storage) and is sent as an Authorization header. ' +
        '(When delayd runs with authentication off, the console opens without one.)'),
      h('div', { class: 'row' }, input, h('button', { id: 'signin-btn', type: 'submit' }, 'Sign in')));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      clearError();
      try {
        await signIn(input.value.trim());
        input.value = '';
        if (location.hash !== '#/') location.hash = '#/';
        else render();
      } catch (e) {
        showError(e);
      }
    });
    main.replaceChildren(form);
    input.focus();
  }

  // ---- namespaces ----------------------------------------------------------

  function viewNamespaces(g) {
    crumbs.replaceChildren('namespaces');
    const goto = h('input', { id: 'goto-ns', type: 'text', placeholder: 'namespace name' });
    const gotoForm = h('form', { class: 'row' }, goto, h('button', { type: 'submit', class: 'secondary' }, 'Open'));
    gotoForm.addEventListener('submit', (ev) => {
      ev.preventDefault();
      if (goto.value.trim()) location.hash = '#/ns/' + encodeURIComponent(goto.value.trim()) + '/scheduled';
    });
    const tbody = h('tbody');
    const table = h('table', { id: 'namespaces' },
      h('thead', {}, h('tr', {},
        h('th', {}, 'namespace'), h('th', { class: 'num' }, 'scheduled'), h('th', { class: 'num' }, 'due now'),
        h('th', { class: 'num' }, 'in flight'), h('th', { class: 'num' }, 'dead'),
        h('th', { class: 'num' }, 'oldest due lateness'))),
      tbody);
    const note = h('p', { class: 'muted', id: 'ns-note' });
    main.replaceChildren(
      h('div', { class: 'card' },
        h('h1', {}, 'Namespaces'),
        gotoForm, table, note,
        globalKey() && may('ADMIN', '*') ? h('p', {}, h('a', { href: '#/keys', id: 'global-keys' }, 'Global API keys')) : ''));

    guard(g, async () => {
      let names = [];
      if (!globalKey()) {
        names = [me.key.namespace];
      } else if (may('ADMIN', '*')) {
        let token = '';
        do {
          const page = await call('NamespaceService/ListNamespaces', { pageSize: 1000, pageToken: token });
          if (g !== gen) return;
          names.push(...(page.namespaces || []).map((n) => n.name));
          token = page.nextPageToken || '';
        } while (token && names.length < 10000);
      } else {
        note.textContent = 'Listing namespaces needs a global admin key; open a namespace by name.';
      }
      const rows = new Map();
      tbody.replaceChildren(...names.map((name) => {
        const cells = ['scheduled', 'dueNow', 'delivered', 'dead', 'lateness'].map(
          (c) => h('td', { class: c === 'lateness' ? 'num lateness' : 'num', 'data-col': c }, '…'));
        const tr = h('tr', { 'data-ns': name },
          h('td', {}, h('a', { href: '#/ns/' + encodeURIComponent(name) + '/scheduled' }, name)), cells);
        rows.set(name, { tr, cells });
        return tr;
      }));
      if (names.length === 0 && globalKey() && may('ADMIN', '*')) note.textContent = 'No namespaces yet.';
      const admin = names.filter((n) => may('ADMIN', n)).slice(0, STATS_MAX);
      const shown = new Set(admin);
      if (shown.size < names.length) {
        note.textContent = names.some((n) => !may('ADMIN', n))
          ? 'Stats need the admin scope on the namespace.'
          : 'Live stats are shown for the first ' + STATS_MAX + ' namespaces; open one for its own.';
        for (const n of names) if (!shown.has(n)) rows.get(n).cells.forEach((c) => { c.textContent = '—'; });
      }
      live(() => guard(g, async () => {
        await Promise.all(admin.map(async (name) => {
          let s;
          try {
            s = await call('NamespaceService/GetNamespaceStats', { namespace: name });
          } catch (e) {
            if (e.code !== 'not_found') throw e;
            if (g !== gen) return;
            // Deleted since the list was read (by someone else): say so on
            // its row and stop asking, rather than an error for the page.
            const { tr, cells } = rows.get(name);
            tr.classList.add('deleted');
            cells.forEach((c, i) => { c.textContent = i === 0 ? 'deleted' : '—'; });
            if (admin.includes(name)) admin.splice(admin.indexOf(name), 1);
            return;
          }
          if (g !== gen) return;
          const { tr, cells } = rows.get(name);
          const late = seconds(s.oldestDueLateness);
          [num(s.scheduled), num(s.dueNow), num(s.delivered), num(s.dead), fmtDuration(late)]
            .forEach((v, i) => { cells[i].textContent = v; });
          tr.classList.toggle('late', late >= 1);
        }));
      }));
    });
  }

  // ---- one namespace -------------------------------------------------------

  const TABS = [
    ['scheduled', 'Scheduled'], ['inflight', 'In flight'], ['dead', 'Dead letters'], ['live', 'Live deliveries'],
    ['schedules', 'Schedules'], ['keys', 'Keys'],
  ];

  function viewNamespace(g, ns, tab) {
    const admin = may('ADMIN', ns);
    crumbs.replaceChildren(h('a', { href: '#/' }, 'namespaces'), ' / ', ns);
    const stats = h('div', { class: 'stats', id: 'stats' });
    const forecast = h('div', { class: 'forecast', id: 'forecast' });
    const detail = h('div', { id: 'task-detail' });
    const idInput = h('input', { id: 'task-id', type: 'search', placeholder: 'task id' });
    const find = h('form', { class: 'row', id: 'find' }, idInput, h('button', { id: 'find-btn', type: 'submit' }, 'Find task'));
    find.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const id = idInput.value.trim();
      if (id) lookup(g, ns, id, detail);
    });
    const body = h('div', { id: 'tab-body' });
    const tabs = h('nav', { class: 'tabs' }, TABS.filter(([t]) => (t !== 'keys' || admin) && (t !== 'live' || admin || may('CONSUME', ns)) &&
      (t !== 'schedules' || admin || may('PRODUCE', ns))).map(([t, label]) =>
      h('a', { href: '#/ns/' + encodeURIComponent(ns) + '/' + t, class: t === tab ? 'active' : '', id: 'tab-' + t }, label)));
    // A key of another namespace sees the server's error and nothing else
    // of this one. (A key of this namespace that lacks a scope sees the
    // error beside what it may see.)
    if (!globalKey() && me.key.namespace !== ns) denied = () => {
      timers.forEach(clearInterval);
      timers = [];
      main.replaceChildren(h('div', { class: 'card', id: 'no-access' },
        h('h1', {}, 'No access to ', ns),
        h('p', {}, 'This API key (', h('code', {}, me.key.id || ''), ' on ',
          me.key.namespace === '*' ? 'all namespaces' : me.key.namespace, ') may not read namespace ', h('code', {}, ns), '.'),
        h('p', {}, h('a', { href: '#/' }, 'Back to namespaces'))));
    };
    main.replaceChildren(
      h('div', { class: 'card' },
        h('h1', {}, ns, ' ', admin ? '' : h('span', { class: 'badge ro', id: 'read-only' }, 'read-only')),
        stats, forecast),
      h('div', { class: 'card' }, find, detail),
      h('div', { class: 'card' }, tabs, body));

    if (admin) {
      live(() => guard(g, async () => {
        const s = await call('NamespaceService/GetNamespaceStats', { namespace: ns });
        if (g !== gen) return;
        const stat = (k, v, id) => h('div', { class: 'stat' }, h('div', { class: 'v', id }, v), h('div', { class: 'k' }, k));
        stats.replaceChildren(
          stat('scheduled', num(s.scheduled), 'stat-scheduled'), stat('due now', num(s.dueNow), 'stat-due'),
          stat('in flight', num(s.delivered), 'stat-delivered'), stat('dead', num(s.dead), 'stat-dead'),
          stat('oldest due lateness', fmtDuration(seconds(s.oldestDueLateness)), 'stat-lateness'),
          stat('deliveries', s.paused ? 'paused' : 'running', 'stat-paused'),
          stat('rate cap', s.maxDispatchRate ? s.maxDispatchRate + '/s' : 'unlimited', 'stat-rate'),
          stat('delivered by', s.push ? 'HTTP push' : 'Subscribe', 'stat-delivery'));
        forecast.replaceChildren(...forecastCharts(s));
      }));
    } else {
      stats.replaceChildren(h('span', { class: 'muted' }, 'Stats, dead-letter actions and keys need the admin scope on this namespace.'));
    }

    switch (tab) {
      case 'inflight': return taskList(g, ns, 'TASK_STATE_DELIVERED', body, detail);
      case 'dead': return admin ? deadLetters(g, ns, body, detail) : taskList(g, ns, 'TASK_STATE_DEAD', body, detail);
      case 'keys': return admin ? keys(g, ns, body) : body.replaceChildren(h('p', { class: 'muted' }, 'Keys need the admin scope.'));
      case 'live': return liveDeliveries(g, ns, body, detail);
      case 'schedules': return window.delaydSchedules({
        call, h, guard, fmtTime, may, clearError, current: (v) => v === gen, lookup: (id) => lookup(g, ns, id, detail),
      }, g, ns, body);
      default: return taskList(g, ns, 'TASK_STATE_SCHEDULED', body, detail);
    }
  }

  function lookup(g, ns, id, detail) {
    clearError();
    detail.replaceChildren(h('p', { class: 'muted' }, 'Looking up ', id, '…'));
    guard(g, async () => {
      try {
        const { task } = await call('TaskService/GetTask', { namespace: ns, id });
        if (g !== gen) return;
        detail.replaceChildren(taskDetail(g, ns, task, detail), historyBox(g, ns, id));
      } catch (e) {
        if (e.code === 'not_found' && g === gen) {
          // Gone (acked, removed, purged): its history may still say why.
          detail.replaceChildren(h('p', { id: 'task-gone' }, 'Task ', h('code', {}, id), ' does not exist (acked, removed, or never created).'),
            historyBox(g, ns, id));
          return;
        }
        detail.replaceChildren();
        throw e;
      }
    });
  }

  // historyBox shows task id's history (GetTaskHistory), oldest first,
  // filled in when the pages arrive.
  function historyBox(g, ns, id) {
    const box = h('div', { class: 'history', id: 'task-history' }, h('h2', {}, 'History'), h('p', { class: 'muted' }, 'Loading…'));
    guard(g, async () => {
      const events = [];
      let token = '';
      let enabled = false;
      for (let page = 0; page < 20; page++) {
        const r = await call('TaskService/GetTaskHistory', { namespace: ns, id, pageToken: token });
        enabled = !!r.historyEnabled;
        events.push(...(r.events || []));
        token = r.nextPageToken || '';
        if (!token) break;
      }
      if (g !== gen) return;
      if (!enabled) {
        box.replaceChildren(h('h2', {}, 'History'), h('p', { class: 'muted', id: 'history-off' },
          'This namespace keeps no task history (its policy\'s historyRetentionBytes is 0).'));
        return;
      }
      const kind = (k) => (k || '').replace('TASK_EVENT_KIND_', '').toLowerCase().replace('_', ' ');
      const detailOf = (e) => [
        e.scheduleId ? 'fired by schedule ' + e.scheduleId + ' for slot ' + fmtTime(e.slotTime) : '',
        e.replica ? 'replica ' + e.replica + ', ' + fmtDuration(seconds(e.lateness)) + ' late' : '',
        e.reason ? 'reason: ' + e.reason : '',
        e.retryAfter ? 'retry after ' + fmtDuration(seconds(e.retryAfter)) : '',
      ].filter(Boolean).join('; ');
      box.replaceChildren(h('h2', {}, 'History'), h('table', { id: 'history' },
        h('thead', {}, h('tr', {}, ['time', 'event', 'generation', 'attempt', 'due', 'key', 'detail'].map((c) => h('th', {}, c)))),
        h('tbody', {}, events.map((e) => h('tr', { 'data-kind': kind(e.kind) },
          h('td', {}, fmtTime(e.time)), h('td', {}, kind(e.kind)), h('td', { class: 'num' }, Number(e.generation) || ''),
          h('td', { class: 'num' }, Number(e.attempt) || ''), h('td', {}, fmtTime(e.dueTime)), h('td', {}, h('code', {}, e.keyId || '')),
          h('td', {}, detailOf(e)))))));
    });
    return box;
  }

  // svg builds an SVG element (h builds HTML ones).
  function svg(tag, attrs, ...kids) {
    const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    el.append(...kids);
    return el;
  }

  // barChart draws counts as bars, one per bucket, scaled to the largest;
  // each bar carries its count (data-n) and a tooltip.
  function barChart(id, title, counts, label) {
    const W = 360, H = 80, peak = Math.max(1, ...counts);
    const bw = W / Math.max(1, counts.length);
    const bars = counts.map((n, i) => {
      const bh = n ? Math.max(2, Math.round((n / peak) * (H - 4))) : 0;
      return svg('rect', { class: 'bar', x: (i * bw).toFixed(1), y: H - bh, width: Math.max(1, bw - 1).toFixed(1), height: bh, 'data-n': n },
        svg('title', {}, label(i) + ': ' + n));
    });
    const total = counts.reduce((a, b) => a + b, 0);
    return h('figure', { class: 'chart', id },
      svg('svg', { viewBox: '0 0 ' + W + ' ' + H, width: W, height: H, role: 'img', 'aria-label': title }, svg('line', { class: 'axis', x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5 }), ...bars),
      h('figcaption', {}, title + ' — ' + total + ' tasks, peak ' + Math.max(0, ...counts)));
  }

  // forecastCharts are the due forecast (per minute over the hour, per
  // hour over the day) beside this replica's recent deliveries.
  function forecastCharts(s) {
    const ints = (a) => (a || []).map(Number);
    const recent = h('div', { class: 'stats recent', id: 'recent' },
      ...[['delivered / min', ((s.recentDeliveryRate || 0) * 60).toFixed(1), 'recent-rate'],
        ['lateness p50', fmtDuration(seconds(s.recentLatenessP50)), 'recent-p50'],
        ['lateness p90', fmtDuration(seconds(s.recentLatenessP90)), 'recent-p90'],
        ['lateness p99', fmtDuration(seconds(s.recentLatenessP99)), 'recent-p99']].map(([k, v, id]) =>
        h('div', { class: 'stat' }, h('div', { class: 'v', id }, v), h('div', { class: 'k' }, k))),
      h('div', { class: 'muted' }, 'last ' + fmtDuration(seconds(s.recentWindow)) + ', as this replica delivered'));
    return [
      barChart('forecast-minutes', 'Falls due, next hour, per minute', ints(s.duePerMinute), (i) => '+' + i + '–' + (i + 1) + ' min'),
      barChart('forecast-hours', 'Falls due, next day, per hour', ints(s.duePerHour), (i) => '+' + i + '–' + (i + 1) + ' h'),
      h('p', { class: 'muted', id: 'forecast-firings' }, 'of which schedules\' firings not created yet: ' +
        ints(s.firingsPerHour).reduce((a, b) => a + b, 0) + ' in the next day' + (s.firingsPartial ? ' (the first 1,000 schedules)' : '')),
      recent,
    ];
  }

  function taskDetail(g, ns, t, detail) {
    const rows = [
      ['id', h('code', { id: 'detail-id' }, t.id)], ['state', h('span', { id: 'detail-state' }, (t.state || '').replace('TASK_STATE_', ''))],
      ['kind', t.kind || ''], ['due', fmtTime(t.dueTime)], ['attempt', num(t.attempt)], ['generation', num(t.generation)],
      ['lease deadline', fmtTime(t.leaseDeadline)], ['died', fmtTime(t.deadTime)], ['last error', t.lastError || ''],
      ['created', fmtTime(t.createTime)], ['updated', fmtTime(t.updateTime)],
      ['payload', h('pre', { id: 'detail-payload' }, payloadText(t.payload))],
    ].filter(([, v]) => v !== '');
    const box = h('div', { class: 'task' }, h('h2', {}, 'Task'),
      h('dl', { class: 'task' }, rows.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])));
    if (may('ADMIN', ns) && may('PRODUCE', ns)) {
      box.append(h('div', { class: 'row' }, h('button', {
        class: 'danger', id: 'remove-btn', type: 'button',
        onclick: () => guard(g, async () => {
          await call('TaskService/RemoveTask', { namespace: ns, id: t.id });
          if (g !== gen) return;
          detail.replaceChildren(h('p', { id: 'removed' }, 'Removed ', h('code', {}, t.id), '.'));
        }),
      }, 'Remove task')));
    }
    return box;
  }

  function taskTable(id, tasks, when, ns, g, detail, select) {
    const tbody = h('tbody');
    const add = (list) => tbody.append(...list.map((t) => h('tr', { 'data-id': t.id },
      select ? h('td', {}, select(t)) : '',
      h('td', {}, h('a', { href: '#', class: 'task-link', onclick: (ev) => { ev.preventDefault(); lookup(g, ns, t.id, detail); } }, t.id)),
      h('td', {}, t.kind || ''), h('td', {}, fmtTime(when(t))), h('td', { class: 'num' }, num(t.attempt)),
      h('td', {}, t.lastError || ''))));
    add(tasks);
    return { tbody, add };
  }

  function taskList(g, ns, state, body, detail) {
    const when = {
      TASK_STATE_SCHEDULED: ['due', (t) => t.dueTime],
      TASK_STATE_DELIVERED: ['lease deadline', (t) => t.leaseDeadline],
      TASK_STATE_DEAD: ['died', (t) => t.deadTime],
    }[state];
    const { tbody, add } = taskTable('tasks', [], when[1], ns, g, detail);
    const more = h('button', { class: 'secondary', id: 'more', type: 'button', hidden: true }, 'More');
    const empty = h('p', { class: 'muted', id: 'empty', hidden: true }, 'No tasks.');
    body.replaceChildren(
      h('table', { id: 'tasks' }, h('thead', {}, h('tr', {}, h('th', {}, 'id'), h('th', {}, 'kind'),
        h('th', {}, when[0]), h('th', { class: 'num' }, 'attempt'), h('th', {}, 'last error'))), tbody),
      empty, more);
    let token = '';
    const load = () => guard(g, async () => {
      const page = await call('TaskService/ListTasks', { namespace: ns, state, pageSize: PAGE, pageToken: token, view: 'TASK_VIEW_BASIC' });
      if (g !== gen) return;
      add(page.tasks || []);
      token = page.nextPageToken || '';
      more.hidden = !token;
      empty.hidden = tbody.children.length > 0;
    });
    more.addEventListener('click', load);
    load();
  }

  function deadLetters(g, ns, body, detail) {
    const selected = new Set();
    const msg = h('span', { id: 'dead-msg', class: 'muted' });
    const requeue = h('button', { id: 'requeue-btn', type: 'button', disabled: true }, 'Requeue selected');
    const purge = h('button', { id: 'purge-btn', type: 'button', class: 'danger', disabled: true }, 'Purge selected');
    const all = h('input', { type: 'checkbox', id: 'select-all', title: 'select all shown' });
    const filter = h('input', { type: 'search', id: 'dead-filter', placeholder: 'filter: id, kind or error contains…' });
    const empty = h('p', { class: 'muted', id: 'empty', hidden: true }, 'No dead letters.');
    const more = h('button', { class: 'secondary', id: 'more', type: 'button', hidden: true }, 'More');
    let boxes = [];
    let armed = false; // purge needs a second click
    const shownBoxes = () => boxes.filter((cb) => !cb.closest('tr').hidden);
    const sync = () => {
      requeue.disabled = purge.disabled = selected.size === 0;
      armed = false;
      purge.textContent = 'Purge selected';
      const shown = shownBoxes();
      all.checked = shown.length > 0 && shown.every((cb) => cb.checked);
    };
    // The filter narrows the loaded pages in the browser; a hidden row is
    // unselected, so an action never touches what is not shown.
    const applyFilter = () => {
      const q = filter.value.trim().toLowerCase();
      for (const cb of boxes) {
        const tr = cb.closest('tr');
        tr.hidden = q !== '' && !tr.textContent.toLowerCase().includes(q);
        if (tr.hidden && cb.checked) { cb.checked = false; selected.delete(cb.value); }
      }
      sync();
    };
    filter.addEventListener('input', applyFilter);
    const box = (t) => {
      const cb = h('input', { type: 'checkbox', class: 'pick', value: t.id, 'aria-label': 'select ' + t.id });
      cb.addEventListener('change', () => { if (cb.checked) selected.add(t.id); else selected.delete(t.id); sync(); });
      boxes.push(cb);
      return cb;
    };
    all.addEventListener('change', () => {
      for (const cb of shownBoxes()) { cb.checked = all.checked; if (all.checked) selected.add(cb.value); else selected.delete(cb.value); }
      sync();
    });
    const { tbody, add } = taskTable('dead', [], (t) => t.deadTime, ns, g, detail, box);
    body.replaceChildren(
      h('div', { class: 'row' }, filter, requeue, purge, msg),
      h('table', { id: 'dead' }, h('thead', {}, h('tr', {}, h('th', {}, all), h('th', {}, 'id'), h('th', {}, 'kind'),
        h('th', {}, 'died'), h('th', { class: 'num' }, 'attempt'), h('th', {}, 'last error'))), tbody),
      empty, more);
    let token = '';
    const load = (reset) => guard(g, async () => {
      if (reset) { token = ''; }
      const page = await call('NamespaceService/ListDeadLetters', { namespace: ns, pageSize: PAGE, pageToken: token, view: 'TASK_VIEW_BASIC' });
      if (g !== gen) return;
      if (reset) { tbody.replaceChildren(); boxes = []; selected.clear(); }
      add(page.tasks || []);
      token = page.nextPageToken || '';
      more.hidden = !token;
      empty.hidden = tbody.children.length > 0;
      applyFilter();
    });
    more.addEventListener('click', () => load(false));
    requeue.addEventListener('click', () => guard(g, async () => {
      const ids = [...selected];
      const r = await call('NamespaceService/RequeueDeadLetters', { namespace: ns, ids });
      if (g !== gen) return;
      msg.textContent = 'Requeued ' + num(r.requeued) + ' of ' + ids.length + '.';
      await load(true);
    }));
    purge.addEventListener('click', () => guard(g, async () => {
      if (!armed) {
        armed = true;
        purge.textContent = 'Purge ' + selected.size + ' for good?';
        return;
      }
      const ids = [...selected];
      const r = await call('NamespaceService/PurgeDeadLetters', { namespace: ns, ids });
      if (g !== gen) return;
      msg.textContent = 'Purged ' + num(r.purged) + ' of ' + ids.length + '.';
      await load(true);
    }));
    load(true);
  }

  // ---- live deliveries -----------------------------------------------------

  const LIVE_ROWS = 200;

  function liveDeliveries(g, ns, body, detail) {
    const status = h('span', { class: 'muted', id: 'live-status' }, 'connecting…');
    const tbody = h('tbody');
    let seen = 0;
    let missed = 0;
    body.replaceChildren(
      h('p', { class: 'muted' }, 'Each delivery as delayd sends it to a subscriber, on any replica. Watching takes nothing: subscribers still get every task.'),
      h('div', { class: 'row' }, status),
      h('table', { id: 'live' }, h('thead', {}, h('tr', {}, h('th', {}, 'sent'), h('th', {}, 'id'), h('th', {}, 'kind'),
        h('th', { class: 'num' }, 'attempt'), h('th', {}, 'lease until'))), tbody));
    const ctl = new AbortController();
    streams.push(ctl);
    guard(g, async () => {
      await watch(ns, ctl.signal, (c) => {
        if (g !== gen) return;
        const t = c.task || {};
        seen++;
        missed += Number(c.missed || 0);
        status.textContent = seen + ' deliveries seen' + (missed ? ', ' + missed + ' missed (the browser read too slowly)' : '');
        tbody.prepend(h('tr', { 'data-id': t.id },
          h('td', {}, fmtTime(c.deliveryTime)),
          h('td', {}, h('a', { href: '#', onclick: (ev) => { ev.preventDefault(); lookup(g, ns, t.id, detail); } }, t.id)),
          h('td', {}, t.kind || ''), h('td', { class: 'num' }, num(t.attempt)), h('td', {}, fmtTime(c.leaseDeadline))));
        while (tbody.children.length > LIVE_ROWS) tbody.lastChild.remove();
      });
      if (g === gen && !ctl.signal.aborted) status.textContent = 'The server ended the watch; reopen the tab to watch again.';
    });
    status.textContent = 'watching';
  }

  // ---- keys ----------------------------------------------------------------

  function keys(g, ns, body) {
    const tbody = h('tbody');
    const secret = h('div', { id: 'new-secret' });
    const scopes = ['PRODUCE', 'CONSUME', 'ADMIN'].map((s) =>
      h('label', {}, h('input', { type: 'checkbox', value: 'KEY_SCOPE_' + s, class: 'scope' }), ' ', s.toLowerCase()));
    const desc = h('input', { type: 'text', id: 'key-desc', placeholder: 'description' });
    const form = h('form', { class: 'row', id: 'create-key' }, scopes, desc, h('button', { type: 'submit', id: 'create-key-btn' }, 'Create key'));
    body.replaceChildren(
      h('h2', {}, ns === '*' ? 'Global keys' : 'Keys of ' + ns),
      form, secret,
      h('table', { id: 'keys' }, h('thead', {}, h('tr', {}, h('th', {}, 'id'), h('th', {}, 'scopes'),
        h('th', {}, 'description'), h('th', {}, 'created'), h('th', {}))), tbody));
    const load = () => guard(g, async () => {
      // Every page: global keys are not capped, and pages are cut by bytes.
      const keys = [];
      let pageToken = '';
      do {
        const r = await call('NamespaceService/ListKeys', { namespace: ns, pageSize: 1000, pageToken });
        if (g !== gen) return;
        keys.push(...(r.keys || []));
        pageToken = r.nextPageToken || '';
      } while (pageToken);
      tbody.replaceChildren(...keys.map((k) => h('tr', { 'data-key': k.id },
        h('td', {}, h('code', {}, k.id)), h('td', {}, (k.scopes || []).map((s) => h('span', { class: 'badge' }, scopeName(s)))),
        h('td', {}, k.description || ''), h('td', {}, fmtTime(k.createTime)),
        h('td', {}, h('button', {
          type: 'button', class: 'danger secondary',
          onclick: () => guard(g, async () => { await call('NamespaceService/RevokeKey', { id: k.id }); load(); }),
        }, 'Revoke')))));
    });
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      clearError();
      guard(g, async () => {
        const picked = scopes.map((l) => l.querySelector('input')).filter((i) => i.checked).map((i) => i.value);
        const r = await call('NamespaceService/CreateKey', { namespace: ns, scopes: picked, description: desc.value });
        if (g !== gen) return;
        secret.replaceChildren(h('p', { class: 'secret' }, 'New key ', h('code', {}, r.key.id),
          ' — copy its secret now, it is not shown again: ', h('code', { id: 'secret-value' }, r.secret)));
        load();
      });
    });
    load();
  }

  function viewGlobalKeys(g) {
    crumbs.replaceChildren(h('a', { href: '#/' }, 'namespaces'), ' / global keys');
    const body = h('div');
    main.replaceChildren(h('div', { class: 'card' }, body));
    if (!may('ADMIN', '*') || !globalKey()) {
      body.replaceChildren(h('p', { class: 'muted' }, 'Global keys need a global admin key.'));
      return;
    }
    keys(g, '*', body);
  }

  // ---- routing ---------------------------------------------------------------

  function render() {
    timers.forEach(clearInterval);
    timers = [];
    streams.forEach((c) => c.abort());
    streams = [];
    gen++;
    denied = null;
    clearError();
    renderHeader();
    if (!me) {
      crumbs.replaceChildren();
      viewSignIn();
      return;
    }
    const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
    if (parts[0] === 'ns' && parts[1]) viewNamespace(gen, parts[1], parts[2] || 'scheduled');
    else if (parts[0] === 'keys') viewGlobalKeys(gen);
    else viewNamespaces(gen);
  }
  window.addEventListener('hashchange', render);

  // A key already in this tab's session: check it is still valid. Without
  // one, ask whether this delayd wants one at all: with authentication off
  // WhoAmI answers a keyless call (authEnabled false) and the console opens
  // without asking for a key; with it on, the call is refused and the
  // sign-in form asks.
  (async () => {
    if (sessionStorage.getItem(KEY)) {
      try {
        me = await call('NamespaceService/WhoAmI', {});
      } catch (e) {
        sessionStorage.removeItem(KEY);
        me = null;
        render();
        showError(e);
        return;
      }
    } else {
      try {
        const who = await call('NamespaceService/WhoAmI', {});
        if (!who.authEnabled) me = who;
      } catch (_) {
        me = null; // authentication is on (or delayd is down): the form asks
      }
    }
    render();
  })();
})();

// delayd web console: a namespace's schedules (recurring tasks). Loaded
// before console.js, which calls delaydSchedules with the helpers it owns
// (the API call, the DOM builder, error handling) when the Schedules tab is
// open. Plain JavaScript, no build step; strings go into text nodes only.
'use strict';

// delaydSchedules renders the Schedules tab of namespace ns into body:
// the schedules with their state and next slot, pause / resume / delete,
// a preview of the next firings in UTC and in the schedule's zone, and a
// form to create one. api: {call, h, guard, current(g), fmtTime, may,
// lookup(id), clearError}.
window.delaydSchedules = function delaydSchedules(api, g, ns, body) {
  const { call, h, guard, fmtTime } = api;
  const manage = api.may('PRODUCE', ns) || api.may('ADMIN', ns);
  const preview = h('div', { id: 'schedule-preview' });
  const msg = h('span', { class: 'muted', id: 'schedule-msg' });
  const tbody = h('tbody');
  const empty = h('p', { class: 'muted', id: 'schedules-empty', hidden: true }, 'No schedules.');

  // every parses "15m", "1h30m", "90s", "1d" into a JSON duration ("900s").
  function every(text) {
    const re = /(\d+)(d|h|m|s)/g;
    let total = 0;
    let used = '';
    for (let m = re.exec(text); m; m = re.exec(text)) {
      total += Number(m[1]) * { d: 86400, h: 3600, m: 60, s: 1 }[m[2]];
      used += m[0];
    }
    if (!total || used !== text.replace(/\s+/g, '')) throw new Error('every: write it like 15m, 1h30m, 90s or 1d');
    return total + 's';
  }

  // ruleOf shows a rule: the cron expression, or the rate as 1h30m.
  function ruleOf(s) {
    if (s.cron) return s.cron;
    let n = Math.round(parseFloat(s.every || '0'));
    let out = '';
    for (const [unit, size] of [['d', 86400], ['h', 3600], ['m', 60], ['s', 1]]) {
      if (n >= size) { out += Math.floor(n / size) + unit; n %= size; }
    }
    return 'every ' + (out || '0s');
  }

  function showPreview(id, resp) {
    preview.replaceChildren(
      h('h2', {}, 'Next firings of ', h('code', {}, id)),
      h('table', { id: 'preview' },
        h('thead', {}, h('tr', {}, ['slot (UTC)', 'local (' + (resp.timeZone || 'UTC') + ')', 'task id', 'due'].map((c) => h('th', {}, c)))),
        h('tbody', {}, (resp.firings || []).map((f) => h('tr', {},
          h('td', {}, fmtTime(f.slotTime)), h('td', { class: 'local' }, f.localTime), h('td', {}, h('code', {}, f.taskId)),
          h('td', {}, fmtTime(f.dueTime)))))),
      h('p', { class: 'muted', id: 'tz-version' }, 'tz database ' + (resp.tzDataVersion || '')));
  }

  const load = () => guard(g, async () => {
    const all = [];
    let pageToken = '';
    do {
      const r = await call('ScheduleService/ListSchedules', { namespace: ns, pageSize: 1000, pageToken });
      if (!api.current(g)) return;
      all.push(...(r.schedules || []));
      pageToken = r.nextPageToken || '';
    } while (pageToken && all.length < 10000);
    empty.hidden = all.length > 0;
    tbody.replaceChildren(...all.map((s) => {
      const state = (s.state || '').replace('SCHEDULE_STATE_', '').toLowerCase();
      const act = (label, cls, fn) => h('button', { type: 'button', class: cls, 'data-action': label.toLowerCase(),
        onclick: () => guard(g, async () => { api.clearError(); await fn(); if (api.current(g)) load(); }) }, label);
      return h('tr', { 'data-schedule': s.id, 'data-state': state },
        h('td', {}, h('code', {}, s.id)), h('td', {}, ruleOf(s)), h('td', {}, s.timeZone || 'UTC'),
        h('td', { class: 'state' }, state), h('td', {}, fmtTime(s.nextSlotTime)),
        h('td', { class: 'num' }, String(s.fired || 0)), h('td', { class: 'num' }, String(s.skipped || 0)),
        h('td', {}, s.lastTaskId ? h('a', { href: '#', class: 'task-link', onclick: (ev) => { ev.preventDefault(); api.lookup(s.lastTaskId); } }, s.lastTaskId) : ''),
        h('td', {},
          act('Preview', 'secondary', async () => {
            const r = await call('ScheduleService/PreviewSchedule', { namespace: ns, id: s.id, count: 10 });
            if (api.current(g)) showPreview(s.id, r);
          }),
          manage && state === 'active' ? act('Pause', 'secondary', async () => {
            const r = await call('ScheduleService/PauseSchedule', { namespace: ns, id: s.id });
            msg.textContent = 'Paused ' + s.id + '; removed ' + (r.removedFirings || 0) + ' firings not due yet.';
          }) : '',
          manage && state === 'paused' ? act('Resume', 'secondary', async () => {
            await call('ScheduleService/ResumeSchedule', { namespace: ns, id: s.id });
            msg.textContent = 'Resumed ' + s.id + '.';
          }) : '',
          manage ? act('Delete', 'danger secondary', async () => {
            const r = await call('ScheduleService/DeleteSchedule', { namespace: ns, id: s.id });
            msg.textContent = 'Deleted ' + s.id + ' and ' + (r.removedFirings || 0) + ' firings not due yet.';
          }) : ''));
    }));
  });

  const field = (id, placeholder) => h('input', { type: 'text', id, placeholder });
  const f = {
    id: field('new-schedule-id', 'id'), cron: field('new-schedule-cron', 'cron, e.g. 0 9 * * 1-5'),
    every: field('new-schedule-every', 'or every, e.g. 15m'), tz: field('new-schedule-tz', 'time zone, e.g. Europe/Berlin'),
    kind: field('new-schedule-kind', 'task kind'), payload: field('new-schedule-payload', 'payload (text)'),
  };
  const form = h('form', { class: 'row', id: 'create-schedule' }, Object.values(f),
    h('button', { type: 'submit', id: 'create-schedule-btn' }, 'Create schedule'),
    h('button', { type: 'button', class: 'secondary', id: 'try-schedule-btn' }, 'Preview'));
  const definition = () => {
    const s = { namespace: ns, id: f.id.value.trim() || 'preview', timeZone: f.tz.value.trim(),
      task: { kind: f.kind.value, payload: btoa(String.fromCharCode(...new TextEncoder().encode(f.payload.value))) } };
    if (f.cron.value.trim()) s.cron = f.cron.value.trim();
    if (f.every.value.trim()) s.every = every(f.every.value.trim());
    return s;
  };
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    api.clearError();
    guard(g, async () => {
      const r = await call('ScheduleService/CreateSchedule', { schedule: definition() });
      if (!api.current(g)) return;
      msg.textContent = 'Created ' + r.schedule.id + '.';
      load();
    });
  });
  form.querySelector('#try-schedule-btn').addEventListener('click', () => {
    api.clearError();
    guard(g, async () => {
      const s = definition();
      const r = await call('ScheduleService/PreviewSchedule', { namespace: ns, schedule: s, count: 10 });
      if (api.current(g)) showPreview(s.id, r);
    });
  });

  body.replaceChildren(
    h('p', { class: 'muted' }, 'Each slot of a schedule becomes an ordinary task of this namespace (id: schedule id + slot), created shortly before its slot.'),
    manage ? form : '', h('div', { class: 'row' }, msg),
    h('table', { id: 'schedules' }, h('thead', {}, h('tr', {},
      ['id', 'rule', 'zone', 'state', 'next slot', 'fired', 'skipped', 'last firing', ''].map((c) =>
        h('th', { class: c === 'fired' || c === 'skipped' ? 'num' : '' }, c)))), tbody),
    empty, preview);
  load();
};

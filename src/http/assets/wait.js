// The waiting room: joins (or resumes the place kept in localStorage, so a reload never
// loses it), shows position, people in line and estimated wait, follows the place live over
// a WebSocket (polling GET /queue/status while the socket is down), and when the turn comes,
// enters and forwards to the event's target_url with ?waitroom_token=<access token>.
//
// Closing the tab sends nothing on purpose: a closed tab or a network blip must not cost the
// place; only its heartbeat lapsing does. Only the Leave button gives the place up.
'use strict';

(() => {
  const TEXT = {
    en: {
      brand: 'Waiting room', yourPosition: 'Your place in line', inLine: 'People in line',
      eta: 'Estimated wait', progress: 'Progress through the line',
      joining: 'Joining the line…', resuming: 'Finding your place…',
      waiting: 'You are in line', waitingLead: 'Keep this page open. When it is your turn, you will be taken to the site automatically.',
      paused: 'Admissions are paused for a moment. Your place is kept.',
      ready: 'It is your turn!', readyLead: 'Taking you to the site…',
      active: 'You are in', activeLead: 'Your session is open. Continue to the site.',
      left: 'You left the line', leftLead: 'Your place was given up. You can join again at the back of the line.',
      expired: 'Your place expired', expiredLead: 'This page was closed or offline for too long. You can join again.',
      cleared: 'The line was cleared', clearedLead: 'The organiser closed this line. You can try to join again.',
      gone: 'Your place has ended', goneLead: 'This place is no longer in the line. You can join again.',
      notFound: 'This event does not exist', notFoundLead: 'Please check the address of this page.',
      refused: 'This link does not let you in', refusedLead: 'Your sign-in link or invite code is missing, expired or already used. Ask the organiser for a new link.',
      closed: 'This line is closed', closedLead: 'The event is not taking new people right now. Please try again later.',
      full: 'The line is full', fullLead: 'Trying again in a few seconds…',
      offline: 'Reconnecting…', offlineLead: 'Your place is kept while we reconnect.',
      noTarget: 'You are admitted, but this event has no site to continue to.',
      joinAgain: 'Join the line again', leave: 'Leave the line', continue: 'Continue to the site',
      live: 'Live updates', polling: 'Updating every few seconds', connecting: 'Connecting…',
      fineprint: 'Reloading this page keeps your place. If it stays closed for more than {d}, your place is given up.',
      announce: 'You are number {n} in line.', announceReady: 'It is your turn.',
      durSoon: 'under 1 min', durMin: 'about {m} min', durHour: 'about {h} h {m} min',
      durExact: '{m} minutes', durHours: '{h} hours', durOne: '1 minute', title: 'Waiting room',
      durRange: '{a}–{b} min', durRangeHours: 'about {a}–{b} h', days: '{d}d ', durUpTo: 'up to {b} min', etaUnknown: 'We don’t know yet', etaPaused: 'Paused',
      checking: 'Checking your browser…', checkingLead: 'This takes a moment and keeps bots out of the line ({n} hashes so far).',
      preQueue: 'The sale opens soon', preQueueLead: 'You are in the pre-queue. At the opening everyone here gets a place in a random order, ahead of later arrivals: there is no need to hurry or reload.',
      opensIn: 'Opens in {t}', opening: 'Opening…',
      announcement: 'Announcement',
      soldOut: 'Sold out', soldOutLead: 'Everything has been sold. Thank you for waiting.',
      saleClosed: 'The sale has ended', saleClosedLead: 'This sale is over. Thank you for waiting.',
      cancelled: 'The sale was cancelled', cancelledLead: 'The organiser called this sale off. Thank you for waiting.',
    },
    ko: {
      brand: '대기실', yourPosition: '나의 대기 순서', inLine: '대기 인원',
      eta: '예상 대기 시간', progress: '대기 진행률',
      joining: '대기열에 들어가는 중…', resuming: '순서를 확인하는 중…',
      waiting: '대기 중입니다', waitingLead: '이 페이지를 열어 두세요. 차례가 되면 자동으로 사이트로 이동합니다.',
      paused: '입장이 잠시 멈췄습니다. 대기 순서는 그대로 유지됩니다.',
      ready: '입장 차례입니다!', readyLead: '사이트로 이동하는 중…',
      active: '입장했습니다', activeLead: '세션이 열려 있습니다. 사이트로 이동하세요.',
      left: '대기열에서 나왔습니다', leftLead: '대기 순서를 포기했습니다. 다시 들어가면 맨 뒤에 줄을 섭니다.',
      expired: '대기 순서가 만료되었습니다', expiredLead: '페이지가 너무 오래 닫혀 있었거나 연결이 끊겼습니다. 다시 들어갈 수 있습니다.',
      cleared: '대기열이 정리되었습니다', clearedLead: '주최 측이 대기열을 닫았습니다. 다시 들어가 볼 수 있습니다.',
      gone: '대기 순서가 끝났습니다', goneLead: '이 순서는 더 이상 대기열에 없습니다. 다시 들어갈 수 있습니다.',
      notFound: '존재하지 않는 이벤트입니다', notFoundLead: '페이지 주소를 확인해 주세요.',
      refused: '이 링크로는 입장할 수 없습니다', refusedLead: '로그인 링크나 초대 코드가 없거나, 만료되었거나, 이미 사용되었습니다. 주최 측에 새 링크를 요청해 주세요.',
      closed: '대기열이 닫혀 있습니다', closedLead: '지금은 새로 입장을 받지 않습니다. 나중에 다시 시도해 주세요.',
      full: '대기열이 가득 찼습니다', fullLead: '잠시 후 다시 시도합니다…',
      offline: '다시 연결하는 중…', offlineLead: '연결하는 동안 대기 순서는 유지됩니다.',
      noTarget: '입장이 허용되었지만 이 이벤트에는 이동할 사이트가 없습니다.',
      joinAgain: '다시 줄 서기', leave: '대기열 나가기', continue: '사이트로 이동',
      live: '실시간 업데이트 중', polling: '몇 초마다 업데이트 중', connecting: '연결 중…',
      fineprint: '새로고침해도 대기 순서는 유지됩니다. 페이지를 {d} 넘게 닫아 두면 순서가 취소됩니다.',
      announce: '현재 대기 순서는 {n}번입니다.', announceReady: '입장 차례입니다.',
      durSoon: '1분 미만', durMin: '약 {m}분', durHour: '약 {h}시간 {m}분',
      durExact: '{m}분', durHours: '{h}시간', durOne: '1분', title: '대기실',
      durRange: '약 {a}~{b}분', durRangeHours: '약 {a}~{b}시간', days: '{d}일 ', durUpTo: '최대 {b}분', etaUnknown: '아직 알 수 없습니다', etaPaused: '일시 중지됨',
      checking: '브라우저를 확인하는 중…', checkingLead: '잠시면 끝나며, 자동 프로그램이 줄을 서지 못하게 막습니다 (지금까지 {n}번 계산).',
      preQueue: '곧 예매가 시작됩니다', preQueueLead: '사전 대기열에 들어와 있습니다. 오픈 시각이 되면 이곳의 모든 분에게 무작위 순서가 정해지며, 이후에 온 분들보다 앞에 섭니다. 서두르거나 새로고침할 필요가 없습니다.',
      opensIn: '오픈까지 {t}', opening: '오픈하는 중…',
      announcement: '공지',
      soldOut: '매진되었습니다', soldOutLead: '모두 판매되었습니다. 기다려 주셔서 감사합니다.',
      saleClosed: '판매가 종료되었습니다', saleClosedLead: '이 판매는 끝났습니다. 기다려 주셔서 감사합니다.',
      cancelled: '판매가 취소되었습니다', cancelledLead: '주최 측이 이 판매를 취소했습니다. 기다려 주셔서 감사합니다.',
    },
  };

  const { t, api, el, show, store, setText } = WR;
  const eventId = decodeURIComponent(location.pathname.replace(/^\/wait\//, '').replace(/\/+$/, ''));
  const PLACE_KEY = 'waitroom:place:' + eventId;
  const UID_KEY = 'waitroom:uid';
  const POLL_MS = 3000;
  // The answers that say the saved place is over (or was never this server's).
  const PLACE_GONE = ['TOKEN_EXPIRED', 'TOKEN_NOT_FOUND', 'TOKEN_INVALID', 'EVENT_NOT_FOUND'];
  let pollAfterSec = POLL_MS / 1000; // the server's poll_after_sec, from the last answer
  const CLIENT_HEARTBEAT_MS = 15000;
  // The server pushes at least every 9.5 s: a socket silent for longer was lost without a
  // close (half-open after a network hand-over). It is given up for polling and a new one.
  const SILENT_MS = 15000;
  // A booking site may link here with a signed user token and/or an invite code:
  // /wait/{event}?user_token=…&invite=…
  const params = new URLSearchParams(location.search);
  const userToken = params.get('user_token');
  const invite = params.get('invite');
  // Who a link names (its user token's subject, read unchecked, else its invite), hashed:
  // in a shared browser each person's place has a slot of its own, and a tab remembers over
  // reloads whose place it shows. Places joined without a link keep the event's slot.
  const VIA_KEY = PLACE_KEY + ':via';
  const linkVia = linkWho();
  let placeVia = linkVia || store.get('sessionStorage', VIA_KEY);
  function linkWho() {
    let who = invite && 'i:' + invite;
    if (userToken) {
      try { who = 'u:' + JSON.parse(atob(userToken.split('.')[1].replace(/-/g, '+').replace(/_/g, '/'))).sub; } catch (_) { who = 'u:' + userToken; }
    }
    if (!who) return null;
    let a = 0x811c9dc5, b = 5381;
    for (const c of who) { const n = c.codePointAt(0); a = Math.imul(a ^ n, 16777619) >>> 0; b = (Math.imul(b, 33) + n) >>> 0; }
    return a.toString(16) + b.toString(16);
  }
  // The tab shows `v`'s place (null: one joined without a link) from now on.
  function keepTab(v) {
    placeVia = v;
    if (v) store.set('sessionStorage', VIA_KEY, v); else store.del('sessionStorage', VIA_KEY);
  }
  const REFUSED = ['USER_TOKEN_INVALID', 'USER_TOKEN_EXPIRED', 'USER_TOKEN_REQUIRED', 'INVITE_REQUIRED', 'INVITE_INVALID'];

  let info = null;              // the public event (name, target_url, paused)
  let place = loadPlace(true);  // {token, start}
  let phase = 'init';           // init | joining | waiting | ready | active | ended | offline
  let ended = null;             // which ended screen
  let powHashes = null;         // proof of work: hashes tried so far while solving, else null
  let powSolution;              // proof of work: sent with the next join, once
  let figures = null;           // last {position, queue_length, eta_sec, eta_low_sec, eta_high_sec}
  let opensAt = null;           // pre-queue: the opening on this device's clock (ms), else null
  let countdownTimer = null;
  let ws = null;
  let wsTimer = null, pollTimer = null, reconnectTimer = null, infoTimer = null;
  let backoff = 1000;
  let lastAnnounced = { n: null, at: 0 };
  let notice = null;            // the operator's announcement {message: {ko, en}, at}, else null
  let saleEnd = null;           // how the sale ended {reason, message}, else null
  // The ended screens of a sale's end, by reason (also for an unknown future reason).
  const SALE_ENDS = { sold_out: 'soldOut', closed: 'saleClosed', cancelled: 'cancelled' };
  let liveMode = 'connecting';

  function slot(v) { return v ? PLACE_KEY + '|' + v : PLACE_KEY; }
  function read(k) {
    try { return JSON.parse(store.get('localStorage', k)) || null; } catch (_) { return null; }
  }
  function loadPlace(any) {
    const p = read(slot(placeVia));
    // (A place a linked join saved in the event's slot, before the slots, says `via`.)
    if (p && p.token && (placeVia || !p.via)) return p;
    // `any`: a tab of nobody yet (a new tab) takes the browser's one person's place.
    const keys = [];
    try {
      for (let i = 0; any && !placeVia && i < localStorage.length; i++) {
        const k = localStorage.key(i);
        if (k.startsWith(PLACE_KEY + '|')) keys.push(k);
      }
    } catch (_) { /* no storage */ }
    const only = keys.length === 1 && read(keys[0]);
    if (!only || !only.token) return null;
    placeVia = keys[0].slice(PLACE_KEY.length + 1);
    return only;
  }
  function savePlace() { store.set('localStorage', slot(placeVia), JSON.stringify(place)); }
  // Only this tab's place is removed: another tab may have saved a newer one since (left
  // and joined again), which must stay (a reload there would make a second place).
  function forgetPlace() {
    const saved = read(slot(placeVia));
    if (!saved || !place || saved.token === place.token) store.del('localStorage', slot(placeVia));
    place = null;
  }

  // One anonymous id per browser, so that two tabs share one place (joins are idempotent per
  // user) instead of queueing twice.
  function userId() {
    let u = store.get('localStorage', UID_KEY);
    if (!u) {
      const b = new Uint8Array(16);
      crypto.getRandomValues(b);
      u = 'web-' + Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
      store.set('localStorage', UID_KEY, u);
    }
    return u;
  }

  // ---- rendering --------------------------------------------------------------------------

  function render() {
    const focused = document.activeElement; // for keepFocus
    const card = el('card');
    card.classList.toggle('state-ended', phase === 'ended');
    renderLook();
    const waitingLike = phase === 'waiting' || phase === 'joining' || phase === 'init' || phase === 'offline';
    show('figures', waitingLike || phase === 'ready');
    show('leave', phase === 'waiting' || phase === 'offline');
    const over = Object.values(SALE_ENDS).includes(ended);
    show('join', phase === 'ended' && ended !== 'notFound' && ended !== 'refused' && !over);
    show('continue', phase === 'active');
    show('live-note', phase === 'waiting' || phase === 'offline');
    show('paused', phase === 'waiting' && info && info.paused);
    setText('paused', t('paused'));

    let title, lead;
    const badge = el('badge');
    badge.hidden = true;
    switch (phase) {
      case 'init': title = t(place ? 'resuming' : 'joining'); lead = ''; break;
      case 'joining': title = t(powHashes === null ? 'joining' : 'checking');
        lead = powHashes === null ? '' : t('checkingLead', { n: WR.num(powHashes) }); break;
      case 'waiting': title = t(opensAt ? 'preQueue' : 'waiting'); lead = t(opensAt ? 'preQueueLead' : 'waitingLead'); break;
      case 'offline': title = t('offline'); lead = t('offlineLead'); break;
      case 'ready': title = t('ready'); lead = (info && info.target_url) || gated() ? t('readyLead') : t('noTarget');
        badge.hidden = false; badge.textContent = '✓'; break;
      case 'active': title = t('active'); lead = t('activeLead'); badge.hidden = false; badge.textContent = '✓'; break;
      case 'ended': title = t(ended); lead = t(ended + 'Lead'); badge.hidden = false; badge.textContent = '–'; break;
      default: title = ''; lead = '';
    }
    setText('status', title); // a live region, as are the next three
    el('message').textContent = lead;
    renderCountdown();
    // Operator text: always set as text, never as markup.
    const said = notice && phase !== 'ended' ? WR.pick(notice.message, el('announcement-text')) : '';
    setText('announcement-text', said);
    show('announcement', !!said);
    const endNote = phase === 'ended' && over && saleEnd ? WR.pick(saleEnd.message, el('end-note')) : '';
    setText('end-note', endNote);
    show('end-note', !!endNote);

    const f = figures;
    const ready = phase === 'ready';
    el('position').textContent = ready ? '✓' : f && f.position ? WR.num(f.position) : '–';
    el('queue-length').textContent = f ? WR.num(f.queue_length) : '–';
    // A lottery (`random`) has no position but an estimate for the middle of the line.
    el('eta').textContent = ready ? '–' : f && (f.position || f.eta_sec != null) ? etaText(f) : '–';
    let pct = 0;
    if (ready) pct = 100;
    else if (f && f.position && place && place.start) {
      pct = ((place.start - f.position + 1) / place.start) * 100;
    }
    pct = Math.max(3, Math.min(100, Math.round(pct)));
    el('bar').style.width = pct + '%';
    el('progress').setAttribute('aria-valuenow', String(pct));

    el('live-dot').className = 'dot ' + liveMode;
    el('live-text').textContent = t(liveMode);
    const idle = info && info.waiting_idle_sec ? info.waiting_idle_sec : 300;
    el('fineprint').textContent = phase === 'waiting' || phase === 'offline'
      ? t('fineprint', { d: idleText(idle) })
      : '';
    const base = t('title');
    const name = eventTitle();
    document.title = phase === 'waiting' && f && f.position
      ? '(' + WR.num(f.position) + ') ' + (name || base)
      : (name ? name + ' · ' : '') + base;
    keepFocus(focused);
  }

  // The event's look and words (title, headline, notes), in the page's language. The server
  // rendered them already; this follows a language switch and a change of settings.
  function eventTitle() {
    if (!info) return el('event-name').textContent || eventId;
    return WR.pick(info.title, el('event-name')) || info.name || info.event_id;
  }

  function renderLook() {
    el('event-name').textContent = eventTitle();
    if (!info) return;
    const headline = WR.pick(info.headline, el('headline'));
    el('headline').textContent = headline;
    show('headline', !!headline);
    // Once it is the person's turn, the note says what happens next.
    const turn = phase === 'ready' || phase === 'active';
    const note = WR.pick(turn ? info.turn_message : info.note, el('note'));
    el('note').textContent = note;
    show('note', !!note && phase !== 'ended');
  }

  // The estimate as the server can vouch for it: "paused" while paused, "we don't know
  // yet" with no basis (eta_low_sec/eta_high_sec null), a range when the range spans more
  // than one rounded figure, else the one figure.
  function etaText(f) {
    if (info && info.paused) return t('etaPaused');
    if (f.eta_low_sec === undefined) return WR.duration(f.eta_sec);
    if (f.eta_low_sec === null || f.eta_high_sec === null) return t('etaUnknown');
    const lo = Math.ceil(f.eta_low_sec / 60);
    const hi = Math.ceil(f.eta_high_sec / 60);
    if (hi <= 1) return t('durSoon');
    if (lo === hi) return WR.duration(f.eta_high_sec);
    if (f.eta_low_sec < 60) return t('durUpTo', { b: hi });
    // Past two hours a range reads in hours ("7200–12960 min" said nothing at a glance).
    if (hi > 120) {
      const a = Math.max(1, Math.floor(lo / 60)), b = Math.ceil(hi / 60);
      return a === b ? WR.duration(f.eta_high_sec) : t('durRangeHours', { a, b });
    }
    return t('durRange', { a: lo, b: hi });
  }

  // The event's state, from a status answer, a queue-update or an event-state message.
  function onEventState(d) {
    if (!info || d.paused === undefined) return;
    info.paused = d.paused;
    if (d.accept_joins !== undefined) info.accept_joins = d.accept_joins;
    render();
  }

  // How long the page may stay closed, rounded down: never more than the real window.
  function idleText(sec) {
    if (sec < 60) return sec + (WR.lang() === 'ko' ? '초' : ' seconds');
    const m = Math.floor(sec / 60);
    return m === 1 ? t('durOne') : m < 120 ? t('durExact', { m }) : t('durHours', { h: Math.floor(m / 60) });
  }

  // Screen readers hear the position when it changes, but not more than every 15 s (a
  // fast-moving line would otherwise talk over everything); the last few places always.
  // The sentence keeps the language it was said in: after a switch it must not be read in
  // the other language's voice.
  function say(text) { const a = el('announce'); a.textContent = text; a.lang = WR.lang(); }
  function announce() {
    if (phase === 'ready') { say(t('announceReady')); return; }
    if (phase !== 'waiting' || !figures || !figures.position) return;
    const n = figures.position;
    const now = Date.now();
    if (n !== lastAnnounced.n && (now - lastAnnounced.at > 15000 || n <= 3)) {
      lastAnnounced = { n, at: now };
      say(t('announce', { n: WR.num(n) }));
    }
  }

  function setPhase(p, which) {
    phase = p;
    if (which !== undefined) ended = which;
    render();
    announce();
  }

  // ---- the place ---------------------------------------------------------------------------

  async function loadInfo() {
    const r = await api('GET', '/api/v1/events/' + encodeURIComponent(eventId));
    if (r.ok) { info = r.data; notice = info.announcement || null; }
    return r;
  }

  // The sale ended (a pushed `ended`, or an error with `error.reason`): the place is over.
  function endSale(reason, message) {
    saleEnd = { reason, message: message || null };
    forgetPlace();
    endWith(SALE_ENDS[reason] || 'closed');
  }

  // An error answer that says the sale ended: its message comes with the event.
  async function endedBy(r) {
    const reason = r.data && r.data.error && r.data.error.reason;
    if (!reason) return false;
    await loadInfo();
    endSale(reason, info && info.ended ? info.ended.message : null);
    return true;
  }

  async function start() {
    const r = await loadInfo();
    if (r.code === 'EVENT_NOT_FOUND' || r.code === 'INVALID_REQUEST') { endWith('notFound'); return; }
    render();
    if (place && place.token) await resume();
    else await join();
    infoTimer = setInterval(async () => { if (phase === 'waiting') { await loadInfo(); render(); } }, 15000);
  }

  async function resume() {
    // The token in a header, not the URL: a proxy's access log keeps URLs.
    const r = await api('GET', '/api/v1/queue/status', { token: place.token });
    if (r.ok) { keepTab(placeVia); forgetLinkSecrets(); onStatus(r.data); connect(); return; }
    if (r.status === 0 || r.status >= 500) { setPhase('offline'); setTimeout(resume, POLL_MS); return; }
    if (await endedBy(r)) return;
    // Only an answer about the place itself ends it. A limit (429: several tabs restored
    // at once poll one place), a proxy's own refusal, anything else: keep the place and
    // ask again (forgetting it would lose a place a link's secrets can no longer get back).
    if (!PLACE_GONE.includes(r.code)) {
      setPhase('offline');
      setTimeout(resume, r.retry ? r.retry * 1000 : POLL_MS);
      return;
    }
    forgetPlace();
    endWith(r.code === 'TOKEN_EXPIRED' ? 'expired' : 'gone');
  }

  // Once the place is saved, the link's user token and invite leave the address bar and
  // the history: whoever saw the URL could otherwise take or leave the place with them
  // until they expire. Kept until then, so a reload before the join still has them.
  function forgetLinkSecrets() {
    if (!params.has('user_token') && !params.has('invite')) return;
    params.delete('user_token');
    params.delete('invite');
    const rest = params.toString();
    history.replaceState(null, '', location.pathname + (rest ? '?' + rest : '') + location.hash);
  }

  async function join() {
    stopLive();
    figures = null;
    setPhase('joining');
    placeVia = linkVia;
    // With a user token, its subject is the user id; otherwise this browser's own id.
    const body = userToken ? { event_id: eventId, user_token: userToken } : { event_id: eventId, user_id: userId() };
    if (invite) body.invite = invite;
    body.pow = takePow();
    const r = await api('POST', '/api/v1/queue/join', { body });
    if (r.ok) {
      const prev = place && place.token === r.data.waiting_token ? place.start : null;
      place = { token: r.data.waiting_token, start: prev || r.data.position || 1 };
      keepTab(linkVia);
      savePlace();
      // The link stays while storage cannot keep the place (a reload must find it).
      const kept = loadPlace();
      if (kept && kept.token === place.token) forgetLinkSecrets();
      onStatus(r.data);
      connect();
      return;
    }
    if (r.code === 'ALREADY_JOINED') {
      // This browser's id holds a place whose token is not here (another tab saved it, or
      // the answer to an earlier join was lost): use the saved one, else start afresh
      // under a new id and let the lost place lapse.
      place = loadPlace();
      if (place && place.token) { await resume(); return; }
      store.del('localStorage', UID_KEY);
      setTimeout(join, 0);
      return;
    }
    if (await endedBy(r)) return;
    if (r.code === 'EVENT_NOT_FOUND') endWith('notFound');
    else if (REFUSED.includes(r.code)) {
      // An invite's place saved before the slots (in the event's slot): its own, as then.
      const old = invite && !userToken && read(PLACE_KEY);
      if (old && old.token && !old.via) { placeVia = null; place = old; await resume(); return; }
      endWith('refused');
    }
    else if (r.code === 'EVENT_CLOSED') endWith('closed');
    else if (r.code === 'QUEUE_FULL') { endWith('full'); setTimeout(join, (r.retry || 10) * 1000); }
    else if (r.data && r.data.error && r.data.error.challenge) solvePow(r.data.error.challenge);
    else { setPhase('offline'); setTimeout(join, POLL_MS); }
  }

  // Proof of work (POW_REQUIRED / POW_INVALID): solved in a worker so the page stays
  // responsive, with a progress note; then the join is sent again with the solution.
  function takePow() { const p = powSolution; powSolution = undefined; return p; }
  function solvePow(challenge) {
    powHashes = 0;
    setPhase('joining');
    let worker;
    try { worker = new Worker('/assets/pow-worker.js'); } catch (_) { // no workers here
      powHashes = null; setPhase('offline'); setTimeout(join, POLL_MS); return;
    }
    const done = () => { worker.terminate(); powHashes = null; };
    worker.onmessage = (e) => {
      if (e.data.progress !== undefined) { powHashes = e.data.progress; render(); return; }
      done();
      powSolution = { prefix: challenge.prefix, nonce: e.data.nonce };
      join();
    };
    worker.onerror = () => { done(); setPhase('offline'); setTimeout(join, POLL_MS); };
    worker.postMessage(challenge);
  }

  function endWith(which) {
    stopLive();
    figures = null;
    setPhase('ended', which);
  }

  // The pre-queue's countdown: the opening as a time on this device's clock (from the
  // server's opens_in_sec, so a wrong device clock does not matter), ticking each second.
  // `opens_in_sec` is rounded up: the middle of that second is taken, narrowed by each
  // answer unless the opening moved; drawn four times a second (once ran a second slow).
  function setOpening(sec) {
    if (sec === undefined || sec === null) opensAt = null;
    else {
      const est = Date.now() + sec * 1000 - 500;
      opensAt = opensAt && Math.abs(est - opensAt) <= 1500 ? Math.min(opensAt, est) : est;
    }
    if (opensAt && !countdownTimer) countdownTimer = setInterval(renderCountdown, 250);
    if (!opensAt && countdownTimer) { clearInterval(countdownTimer); countdownTimer = null; }
  }
  function renderCountdown() {
    const c = el('countdown');
    const on = !!opensAt && (phase === 'waiting' || phase === 'offline');
    show('countdown', on);
    if (!on) return;
    const left = Math.max(0, Math.ceil((opensAt - Date.now()) / 1000));
    const two = (n) => String(n).padStart(2, '0');
    const d = Math.floor(left / 86400), h = Math.floor(left / 3600) % 24, m = Math.floor(left / 60) % 60;
    const text = (d > 0 ? t('days', { d }) : '') + two(h) + ':' + two(m) + ':' + two(left % 60);
    c.textContent = left > 0 ? t('opensIn', { t: text }) : t('opening');
  }

  // A status answer or a queue-update message.
  function onStatus(d) {
    setOpening(d.status === 'pre-queue' ? d.opens_in_sec : null);
    if (d.status === 'admitted') { onReady(); return; }
    if (d.status === 'active') { stopLive(); setPhase('active'); return; }
    figures = {
      position: d.position, queue_length: d.queue_length, eta_sec: d.eta_sec,
      eta_low_sec: d.eta_low_sec, eta_high_sec: d.eta_high_sec,
    };
    if (d.poll_after_sec > 0) pollAfterSec = d.poll_after_sec;
    // `status` carries the announcement (absent: none); a queue-update does not.
    if (d.waited_sec !== undefined && d.type === undefined) notice = d.announcement || null;
    if (info && d.paused !== undefined) info.paused = d.paused;
    if (place && d.position > (place.start || 0)) { place.start = d.position; savePlace(); }
    if (phase !== 'ready') setPhase('waiting');
  }

  // A gated event without target_url (the card names the gate's URL): the turn is the
  // gate's cookie. Entering through the API took a slot leading nowhere, then a second one.
  const GATE = el('card').dataset.gate || null;
  function gated() { return !!GATE && !(info && info.target_url); }

  function onReady() {
    if (phase === 'ready') return;
    stopLive();
    setPhase('ready');
    proceed();
  }

  function proceed() { if (gated()) handOver(); else enter(); }

  // Posts the place's token to the gate as a form (the answer sets the HttpOnly cookie), which
  // lets the person in through this one place.
  function handOver() {
    if (!place) return;
    const form = document.createElement('form');
    form.method = 'post';
    form.action = GATE;
    form.hidden = true;
    const field = document.createElement('input');
    field.type = 'hidden';
    field.name = 'waiting_token';
    field.value = place.token;
    form.appendChild(field);
    document.body.appendChild(form);
    form.submit();
  }

  async function enter() {
    const r = await api('POST', '/api/v1/queue/enter', { body: { waiting_token: place.token } });
    if (r.ok) { go(r.data.access_token); return; }
    if (r.code === 'NOT_READY') { phase = 'waiting'; resume(); return; }
    if (r.code === 'TOKEN_EXPIRED') { forgetPlace(); endWith('expired'); return; }
    if (r.code === 'TOKEN_NOT_FOUND') { forgetPlace(); endWith('gone'); return; }
    setTimeout(enter, 2000);
  }

  function go(accessToken) {
    const target = info && info.target_url;
    if (!target) { render(); return; }
    const url = new URL(target, location.href);
    url.searchParams.set('waitroom_token', accessToken);
    location.assign(url.toString());
  }

  function leave() {
    if (!place) return;
    const body = JSON.stringify({ token: place.token });
    // A beacon survives the tab closing right after the click; fetch is the fallback.
    const queued = navigator.sendBeacon && navigator.sendBeacon('/api/v1/queue/leave', body);
    if (!queued) {
      fetch('/api/v1/queue/leave', {
        method: 'POST', headers: { 'content-type': 'application/json' }, body, keepalive: true,
      }).catch(() => {});
    }
    forgetPlace();
    endWith('left');
  }

  // ---- live updates ------------------------------------------------------------------------

  function handle(msg) {
    switch (msg.type) {
      case 'queue-update': onStatus(msg); break;
      case 'event-state': onEventState(msg); break;
      case 'queue-ready': onReady(); break;
      case 'queue-expired': forgetPlace(); endWith('expired'); break;
      case 'queue-cleared': forgetPlace(); endWith('cleared'); break;
      case 'queue-left': forgetPlace(); endWith(msg.reason === 'completed' ? 'gone' : 'left'); break;
      case 'announcement': notice = msg.message ? msg : null; render(); break;
      case 'ended': endSale(msg.reason, msg.message); break;
      default: break;
    }
  }

  function following() { return phase === 'waiting' || phase === 'offline'; }

  function setLive(mode) { liveMode = mode; render(); }

  function connect() {
    if (!place || ws || !following()) return;
    if (!('WebSocket' in window)) { startPolling(); return; }
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const sock = new WebSocket(proto + '//' + location.host + '/api/v1/queue/ws?token=' + encodeURIComponent(place.token));
    ws = sock;
    let heard = Date.now();
    let beat = Date.now();
    const lost = () => {
      clearInterval(wsTimer);
      if (ws === sock) ws = null;
      if (!following()) return;
      startPolling();
      reconnectTimer = setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, 30000);
    };
    sock.onopen = () => {
      backoff = 1000;
      stopPolling();
      setLive('live');
      heard = Date.now();
      wsTimer = setInterval(() => {
        if (sock.readyState !== 1) return;
        if (Date.now() - heard > SILENT_MS) {
          sock.onclose = null;
          sock.onmessage = null;
          sock.close();
          lost();
          return;
        }
        // The browser answers the server's pings by itself; this is a second, visible sign.
        if (Date.now() - beat >= CLIENT_HEARTBEAT_MS) {
          beat = Date.now();
          sock.send('{"type":"heartbeat"}');
        }
      }, 1000);
    };
    sock.onmessage = (e) => {
      heard = Date.now();
      try { handle(JSON.parse(e.data)); } catch (_) { /* not ours */ }
    };
    sock.onclose = lost;
  }

  // Polls status as often as the server asks (poll_after_sec: seldom far back in the line,
  // often near its front), each answer setting the next delay.
  function startPolling() {
    if (pollTimer) return;
    setLive('polling');
    const tick = async () => {
      if (!pollTimer) return;
      if (!place || !following()) { stopPolling(); return; }
      const r = await api('GET', '/api/v1/queue/status', { token: place.token });
      if (r.ok) onStatus(r.data);
      else if (await endedBy(r)) { /* said why */ }
      else if (r.code === 'TOKEN_EXPIRED') { forgetPlace(); endWith('expired'); }
      else if (r.code === 'TOKEN_NOT_FOUND' || r.code === 'EVENT_NOT_FOUND') { forgetPlace(); endWith('gone'); }
      else if (phase === 'waiting') setPhase('offline');
      if (pollTimer) pollTimer = setTimeout(tick, pollAfterSec * 1000);
    };
    pollTimer = setTimeout(tick, 0);
  }

  function stopPolling() { clearTimeout(pollTimer); pollTimer = null; }

  function stopLive() {
    stopPolling();
    clearTimeout(reconnectTimer);
    clearInterval(wsTimer);
    if (ws) { const s = ws; ws = null; s.onclose = null; s.close(); }
  }

  // ---- wiring -----------------------------------------------------------------------------

  WR.setup(TEXT, render);
  // A focused control the new state hid (a click on it, or a pushed end of the place):
  // focus goes to the control that took its place, else to the status line. (The focus is
  // read before the render: hiding may already have moved it to the page's body.)
  function keepFocus(had) {
    if (!had || !had.hidden) return;
    const next = ['continue', 'join', 'leave'].map(el).find((b) => !b.hidden);
    (next || el('status')).focus();
  }
  el('leave').addEventListener('click', leave);
  el('join').addEventListener('click', join);
  el('continue').addEventListener('click', (e) => { e.preventDefault(); proceed(); });
  // Back from the site through the browser's cache: the page may be stale; look again, at
  // the place saved now (another tab may have replaced this one's meanwhile).
  window.addEventListener('pageshow', (e) => {
    if (!e.persisted || !place) return;
    const saved = loadPlace();
    if (saved && saved.token) place = saved;
    phase = 'init';
    resume();
  });
  // Leaving the page (even into the back/forward cache, where the browser would keep the
  // socket open and answer its pings) stops following: the place then lapses as for a
  // closed tab, unless the person comes back in time (`pageshow` above).
  window.addEventListener('pagehide', stopLive);
  start();
})();

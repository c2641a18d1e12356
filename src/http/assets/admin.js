// The operator's dashboard. Asks for the admin token (kept in sessionStorage: this tab only),
// polls GET /api/v1/admin/events every 1.5 s, draws each event's figures as inline SVG (no
// chart library) from the server's history (GET …/history: the charts show the past at
// once, also after a reload; asked for the cards in view only, a few at a time) topped up
// by its own polls, lists the recent admin changes
// (GET /api/v1/admin/audit), and performs the admin actions: create/update (with the
// waiting page's look and a live preview), pause/resume, clear, delete, and the CSV export
// of an event's history. Errors are told in the page's language, naming the form's labels.
'use strict';

(() => {
  const TEXT = {
    en: {
      brand: 'waitroom dashboard', logout: 'Sign out', signin: 'Operator sign-in',
      signinLead: 'Enter the admin token. The server prints it at start (admin token: …) unless one was configured. It is kept in this tab only.',
      token: 'Admin token', signinButton: 'Sign in', refused: 'This token was refused.', unreachable: 'The server cannot be reached.',
      tooMany: 'Too many wrong tokens from this address. Try again in {s} s.',
      events: 'Events', sumWaiting: 'Waiting', sumInside: 'Admitted + active', sumRate: 'Admitted last minute', sumEvents: 'Events',
      noEvents: 'No events yet. Create one below.', updated: 'Updated {t}', stale: 'Connection lost; retrying…',
      waiting: 'Waiting', admitted: 'Admitted', active: 'Active', capacity: 'Capacity', perMin: 'Admitted/min',
      avgWait: 'Average wait', completed: 'Completed', expired: 'Expired',
      chartQueue: 'Queue length', chartRate: 'Admissions per minute', now: 'now', ago: '−{m} min', agoSec: '−{s} s', collecting: 'Collecting data…',
      admitting: 'Admitting', paused: 'Paused', closed: 'Joins closed',
      pause: 'Pause', resume: 'Resume', edit: 'Edit', clear: 'Clear line', confirmClear: 'Confirm: remove {n} waiting',
      open: 'Open waiting page', cleared: 'Removed {n} waiting places from {id}.', saved: 'Saved {id}.',
      pausedMsg: '{id} is paused: nobody is admitted until it resumes.', resumedMsg: '{id} admits again.',
      editor: 'Create or edit an event', fEventId: 'Event id', hEventId: '1–64 of A–Z a–z 0–9 . _ -', fName: 'Name',
      fMaxActive: 'Max active', fOver: 'Overbooking ratio', fRate: 'Admissions per minute', fMaxQueue: 'Max queue length',
      hEmptyNone: 'empty: no cap', fReady: 'Enter within (s)', fWaitIdle: 'Waiting heartbeat (s)', fSessIdle: 'Session idle (s)',
      fSessMax: 'Session max (s)', fTarget: 'Target URL', fPaused: 'Paused (admit nobody)', fJoins: 'Accept joins',
      save: 'Save event', resetForm: 'Clear form', badId: 'The event id must be 1–64 of A–Z a–z 0–9 . _ -',
      durSoon: '< 1 min', durMin: '{m} min', durHour: '{h} h {m} min', secs: '{s} s',
      del: 'Delete', confirmDelete: 'Confirm: delete {id}', deleted: 'Deleted {id}.',
      lookLegend: 'Look and words of the waiting page', fTitleKo: 'Title (Korean)', fTitleEn: 'Title (English)',
      fHeadlineKo: 'Headline (Korean)', fHeadlineEn: 'Headline (English)',
      fNoteKo: 'Notes while waiting (Korean)', fNoteEn: 'Notes while waiting (English)',
      fTurnKo: 'When it is their turn (Korean)', fTurnEn: 'When it is their turn (English)',
      fTheme: 'Theme colour', hTheme: '#rrggbb; empty: the built-in colour', fLogo: 'Logo URL',
      hLogo: 'an https address, or a file in the data dir\'s branding folder', fSheet: 'Stylesheet',
      hSheet: 'a .css file in the data dir\'s branding folder',
      preview: 'Preview of the waiting page', pvStatus: 'You are in line', pvPosition: 'Your place in line',
      pvButton: 'Continue to the site', pvDefaultTitle: 'Waiting room', defaultIs: 'default: {v}', noCap: 'default: no cap',
      eBetween: '{label}: must be between {a} and {b}.', eAtMost: '{label}: at most {n} characters.',
      eControl: '{label}: must not contain control characters.', eColor: '{label}: a colour as #rrggbb, like #3454d1.',
      eLogo: '{label}: an https address, or /branding/ and a file name (png, jpg, gif, webp, svg).',
      eSheet: '{label}: the name of a .css file in the data dir\'s branding folder.',
      eTarget: '{label}: an http(s) address or a path starting with /.', eNumber: '{label}: enter a number.',
      eInvalid: '{label}: this value is not accepted.', eGeneric: 'The server refused this: {m}',
      eNeedsKey: 'Requiring a user token needs a secret or public key.',
    },
    ko: {
      brand: 'waitroom 대시보드', logout: '로그아웃', signin: '운영자 로그인',
      signinLead: '관리자 토큰을 입력하세요. 따로 설정하지 않았다면 서버가 시작할 때 출력합니다 (admin token: …). 이 탭에만 보관됩니다.',
      token: '관리자 토큰', signinButton: '로그인', refused: '토큰이 거부되었습니다.', unreachable: '서버에 연결할 수 없습니다.',
      tooMany: '잘못된 토큰이 너무 많습니다. {s}초 후에 다시 시도하세요.',
      events: '이벤트', sumWaiting: '대기 중', sumInside: '입장 허용 + 이용 중', sumRate: '최근 1분 입장', sumEvents: '이벤트 수',
      noEvents: '아직 이벤트가 없습니다. 아래에서 만드세요.', updated: '{t} 갱신', stale: '연결이 끊겼습니다. 다시 시도하는 중…',
      waiting: '대기', admitted: '입장 허용', active: '이용 중', capacity: '수용 인원', perMin: '분당 입장',
      avgWait: '평균 대기', completed: '완료', expired: '만료',
      chartQueue: '대기열 길이', chartRate: '분당 입장 수', now: '지금', ago: '−{m}분', agoSec: '−{s}초', collecting: '데이터 수집 중…',
      admitting: '입장 중', paused: '일시 중지', closed: '대기 접수 중지',
      pause: '일시 중지', resume: '재개', edit: '수정', clear: '대기열 비우기', confirmClear: '확인: 대기 {n}명 제거',
      open: '대기실 열기', cleared: '{id}에서 대기 {n}명을 제거했습니다.', saved: '{id}를 저장했습니다.',
      pausedMsg: '{id} 일시 중지: 재개할 때까지 아무도 입장하지 않습니다.', resumedMsg: '{id} 입장을 재개했습니다.',
      editor: '이벤트 만들기 또는 수정', fEventId: '이벤트 ID', hEventId: 'A–Z a–z 0–9 . _ - 중 1–64자', fName: '이름',
      fMaxActive: '최대 동시 이용', fOver: '오버부킹 비율', fRate: '분당 입장 수', fMaxQueue: '최대 대기열 길이',
      hEmptyNone: '비우면 제한 없음', fReady: '입장 제한 시간 (초)', fWaitIdle: '대기 하트비트 (초)', fSessIdle: '세션 유휴 (초)',
      fSessMax: '세션 최대 (초)', fTarget: '이동할 URL', fPaused: '일시 중지 (입장 없음)', fJoins: '대기 접수',
      save: '이벤트 저장', resetForm: '양식 비우기', badId: '이벤트 ID는 A–Z a–z 0–9 . _ - 중 1–64자여야 합니다',
      durSoon: '1분 미만', durMin: '{m}분', durHour: '{h}시간 {m}분', secs: '{s}초',
      del: '삭제', confirmDelete: '확인: {id} 삭제', deleted: '{id}를 삭제했습니다.',
      lookLegend: '대기실 페이지의 모양과 문구', fTitleKo: '제목 (한국어)', fTitleEn: '제목 (영어)',
      fHeadlineKo: '머리말 (한국어)', fHeadlineEn: '머리말 (영어)',
      fNoteKo: '대기 중 안내 (한국어)', fNoteEn: '대기 중 안내 (영어)',
      fTurnKo: '차례가 되었을 때 안내 (한국어)', fTurnEn: '차례가 되었을 때 안내 (영어)',
      fTheme: '테마 색', hTheme: '#rrggbb 형식, 비우면 기본 색', fLogo: '로고 URL',
      hLogo: 'https 주소 또는 데이터 폴더 branding 안의 파일', fSheet: '스타일시트',
      hSheet: '데이터 폴더 branding 안의 .css 파일',
      preview: '대기실 페이지 미리 보기', pvStatus: '대기 중입니다', pvPosition: '나의 대기 순서',
      pvButton: '사이트로 이동', pvDefaultTitle: '대기실', defaultIs: '기본값: {v}', noCap: '기본값: 제한 없음',
      eBetween: '{label}: {a}에서 {b} 사이의 값이어야 합니다.', eAtMost: '{label}: {n}자 이하로 입력하세요.',
      eControl: '{label}: 제어 문자는 쓸 수 없습니다.', eColor: '{label}: #3454d1처럼 #rrggbb 형식의 색이어야 합니다.',
      eLogo: '{label}: https 주소 또는 /branding/ 뒤에 파일 이름(png, jpg, gif, webp, svg)이어야 합니다.',
      eSheet: '{label}: 데이터 폴더 branding 안의 .css 파일 이름이어야 합니다.',
      eTarget: '{label}: http(s) 주소 또는 /로 시작하는 경로여야 합니다.', eNumber: '{label}: 숫자를 입력하세요.',
      eInvalid: '{label}: 받아들일 수 없는 값입니다.', eGeneric: '서버가 요청을 거부했습니다. 입력값을 확인해 주세요.',
      eNeedsKey: '사용자 토큰을 요구하려면 비밀 키나 공개 키가 필요합니다.',
    },
  };
  // The history and audit parts' words, kept apart so the dictionary above stays as it is.
  const RECORDS_TEXT = {
    en: {
      csv: 'Export CSV', range: 'Charts', range10m: 'last 10 min', range1h: 'last hour', range6h: 'last 6 hours', range24h: 'last 24 hours',
      auditTitle: 'Recent admin changes', auditEmpty: 'No admin changes yet.', from: 'from {c}',
      aCreate: 'created', aUpdate: 'changed', aPause: 'paused', aResume: 'resumed', aClear: 'cleared', aDelete: 'deleted', aInvites: 'made invite codes', aInventory: 'added items',
      nCleared: '{n} waiting removed', nInvites: '{n} codes',
    },
    ko: {
      csv: 'CSV 내보내기', range: '차트', range10m: '최근 10분', range1h: '최근 1시간', range6h: '최근 6시간', range24h: '최근 24시간',
      auditTitle: '최근 관리 변경', auditEmpty: '아직 관리 변경이 없습니다.', from: '{c}에서',
      aCreate: '생성', aUpdate: '변경', aPause: '일시 중지', aResume: '재개', aClear: '대기열 비움', aDelete: '삭제', aInvites: '초대 코드 생성', aInventory: '재고 추가',
      nCleared: '대기 {n}명 제거', nInvites: '코드 {n}개',
    },
  };
  // The sale's words: the announcement and the end of the sale, per event card.
  const SALE_TEXT = {
    en: {
      sale: 'Announcement and end of sale', saleMsgKo: 'Message (Korean)', saleMsgEn: 'Message (English)',
      announce: 'Post announcement', unannounce: 'Remove announcement', announced: 'Announced to everyone waiting for {id}.',
      unannounced: 'Removed the announcement of {id}.', endReason: 'Reason', endSale: 'End sale',
      confirmEnd: 'Confirm: end the sale ({n} waiting)', endedMsg: 'The sale of {id} has ended.', ended: 'Ended',
      rSold_out: 'Sold out', rClosed: 'Closed', rCancelled: 'Cancelled', aAnnounce: 'announced', aEnd: 'ended the sale',
    },
    ko: {
      sale: '공지와 판매 종료', saleMsgKo: '메시지 (한국어)', saleMsgEn: '메시지 (영어)',
      announce: '공지 보내기', unannounce: '공지 내리기', announced: '{id} 대기자 모두에게 공지했습니다.',
      unannounced: '{id}의 공지를 내렸습니다.', endReason: '사유', endSale: '판매 종료',
      confirmEnd: '확인: 판매 종료 (대기 {n}명)', endedMsg: '{id}의 판매가 종료되었습니다.', ended: '판매 종료',
      rSold_out: '매진', rClosed: '종료', rCancelled: '취소', aAnnounce: '공지', aEnd: '판매 종료',
    },
  };
  Object.assign(TEXT.en, RECORDS_TEXT.en, SALE_TEXT.en);
  Object.assign(TEXT.ko, RECORDS_TEXT.ko, SALE_TEXT.ko);
  const { t, api, el, show, store } = WR;
  const TOKEN_KEY = 'waitroom:admin';
  const POLL_MS = 1500;
  // The charts' window; the operator may widen it up to the server's 24 h.
  let HISTORY_MS = 10 * 60 * 1000;
  const SVG_NS = 'http://www.w3.org/2000/svg';

  // Only the cards on screen (or within a screen of it) load their history and draw their
  // charts, and at most this many history requests are out at once: with a thousand
  // events the page asked for a thousand histories at once and redrew two thousand charts
  // every poll, and stopped answering.
  const HISTORY_AT_ONCE = 4;
  // New cards are made this many at a time, the page answering in between: making a
  // thousand cards at once held it for seconds.
  const CARDS_AT_ONCE = 200;

  let token = store.get('sessionStorage', TOKEN_KEY);
  let events = [];
  const history = new Map();     // event id → [{t, q, a}]
  const cards = new Map();       // event id → {root, refs}
  const onScreen = new Set();    // event ids of the cards in view
  const historyWanted = new Set(); // event ids whose history is to be asked for, in order
  let historyBusy = 0;
  let moreCards = null;          // the timer that makes the next cards
  let pollTimer = null;
  let pollEvery = POLL_MS;
  let lastOk = 0;

  // ---- sign-in -----------------------------------------------------------------------------

  function signedIn(yes) {
    show('login', !yes);
    show('dash', yes);
    show('logout', yes);
    if (yes) { poll(); loadDefaults(); } else { clearTimeout(pollTimer); el('admin-token').focus(); }
  }

  el('login-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const candidate = el('admin-token').value.trim();
    el('login-error').textContent = '';
    const r = await api('GET', '/api/v1/admin/events', { token: candidate });
    if (r.ok) {
      token = candidate;
      store.set('sessionStorage', TOKEN_KEY, token);
      el('admin-token').value = '';
      events = r.data;
      signedIn(true);
    } else {
      el('login-error').textContent = r.status === 401 ? t('refused')
        : r.status === 429 ? t('tooMany', { s: r.retry || 60 })
          : r.status === 0 ? t('unreachable') : explain(r).text;
    }
  });

  el('logout').addEventListener('click', () => {
    token = null;
    store.del('sessionStorage', TOKEN_KEY);
    signedIn(false);
  });

  // ---- polling and history -----------------------------------------------------------------

  async function poll() {
    clearTimeout(pollTimer);
    if (!token) return;
    const started = Date.now();
    const r = await api('GET', '/api/v1/admin/events', { token });
    if (r.status === 401) {
      token = null;
      store.del('sessionStorage', TOKEN_KEY);
      signedIn(false);
      el('login-error').textContent = t('refused');
      return;
    }
    if (r.ok) {
      events = r.data;
      lastOk = Date.now();
      record();
      refreshAudit();
    }
    render();
    // A list that takes long to fetch and show (thousands of events) is asked for less
    // often: the page spends at most a fifth of its time on it.
    pollEvery = Math.max(POLL_MS, (Date.now() - started) * 4);
    pollTimer = setTimeout(poll, pollEvery);
  }

  // The page's own points, for the cards that were on screen once (the others' charts start
  // from the server's history when they are first shown).
  function record() {
    const now = Date.now();
    for (const e of events) {
      const c = cards.get(e.event_id);
      if (!c || !c.seen) continue;
      let h = history.get(e.event_id);
      if (!h) { h = []; history.set(e.event_id, h); }
      // At most about 720 own points per window: over a wide window the newest point is
      // replaced until it is far enough from the one before.
      const p = { t: now, q: e.waiting, a: e.admitted_last_minute, own: true };
      const last = h[h.length - 1];
      if (h.length >= 2 && last.own && last.t - h[h.length - 2].t < HISTORY_MS / 720) h[h.length - 1] = p;
      else h.push(p);
      while (h.length && h[0].t < now - HISTORY_MS) h.shift();
    }
  }

  // ---- rendering ---------------------------------------------------------------------------

  function secs(s) {
    if (!s) return '–';
    return s < 60 ? t('secs', { s: Math.round(s) }) : WR.duration(s);
  }

  function render() {
    const sum = (k) => events.reduce((n, e) => n + (e[k] || 0), 0);
    el('sum-waiting').textContent = WR.num(sum('waiting'));
    el('sum-inside').textContent = WR.num(sum('admitted') + sum('active'));
    el('sum-rate').textContent = WR.num(sum('admitted_last_minute'));
    el('sum-events').textContent = WR.num(events.length);
    el('updated').textContent = Date.now() - lastOk > pollEvery * 4
      ? t('stale')
      : t('updated', { t: new Date(lastOk).toLocaleTimeString(WR.locale()) });
    show('no-events', events.length === 0);

    const listed = new Set();
    const box = el('events');
    let before = null;
    let made = 0;
    for (const e of events) {
      listed.add(e.event_id);
      let c = cards.get(e.event_id);
      if (!c) {
        if (made === CARDS_AT_ONCE) {
          if (!moreCards) moreCards = setTimeout(() => { moreCards = null; render(); }, 0);
          continue;
        }
        made++;
        c = makeCard(e.event_id);
        cards.set(e.event_id, c);
        addRecordActions(c, e.event_id);
        view.observe(c.root);
      }
      // In the list's order, moving only a card that is out of place.
      const want = before ? before.nextElementSibling : box.firstElementChild;
      if (want !== c.root) box.insertBefore(c.root, want);
      before = c.root;
      updateCard(c, e);
    }
    for (const [id, c] of cards) {
      if (!listed.has(id)) {
        view.unobserve(c.root);
        c.root.remove();
        cards.delete(id);
        history.delete(id);
        onScreen.delete(id);
        historyWanted.delete(id);
      }
    }
  }

  // Tells which cards are in view (a screen's height ahead either way, so that scrolling
  // finds them drawn): a card coming into view asks for its history and is drawn.
  const view = new IntersectionObserver((entries) => {
    for (const en of entries) {
      const id = en.target.dataset.event;
      const c = cards.get(id);
      if (!c) continue;
      if (!en.isIntersecting) { onScreen.delete(id); continue; }
      onScreen.add(id);
      c.seen = true;
      if (c.historyFor !== HISTORY_MS) historyWanted.add(id);
      drawCharts(c, id);
    }
    askHistory();
  }, { rootMargin: '100% 0px' });

  // Asks for the wanted histories, at most HISTORY_AT_ONCE at a time; a card scrolled away
  // before its turn is asked for when it shows again.
  function askHistory() {
    for (const id of historyWanted) {
      if (historyBusy >= HISTORY_AT_ONCE) return;
      historyWanted.delete(id);
      const c = cards.get(id);
      if (!c || !onScreen.has(id) || c.historyFor === HISTORY_MS) continue;
      c.historyFor = HISTORY_MS;
      historyBusy++;
      loadHistory(id).finally(() => { historyBusy--; askHistory(); });
    }
  }

  function node(tag, cls, text) {
    const n = document.createElement(tag);
    if (cls) n.className = cls;
    if (text !== undefined) n.textContent = text;
    return n;
  }

  function makeCard(id) {
    const root = node('article', 'card event-card');
    root.dataset.event = id;
    const head = node('header');
    const h2 = node('h2');
    const name = node('span');
    const idSpan = node('span', 'id', id);
    h2.append(name, idSpan);
    const pill = node('span', 'pill');
    head.append(h2, pill);

    const figs = node('div', 'figs');
    const refs = { name, pill };
    for (const k of ['waiting', 'admitted', 'active', 'capacity', 'perMin', 'avgWait', 'completed', 'expired']) {
      const d = node('div');
      const label = node('span', '', t(k));
      label.dataset.i18n = k;
      const v = node('strong', 'fig-' + k, '–');
      d.append(label, v);
      figs.append(d);
      refs[k] = v;
    }

    const charts = node('div', 'charts');
    refs.chartQueue = chart(charts, 'chartQueue', '');
    refs.chartRate = chart(charts, 'chartRate', 'alt');

    const actions = node('div', 'card-actions');
    const pause = node('button', 'button small pause');
    pause.type = 'button';
    pause.addEventListener('click', () => togglePause(id));
    const edit = node('button', 'button small edit');
    edit.type = 'button';
    edit.dataset.i18n = 'edit';
    edit.textContent = t('edit');
    edit.addEventListener('click', () => fillForm(id));
    const clear = node('button', 'button small danger clear');
    clear.type = 'button';
    clear.addEventListener('click', () => clearLine(id, clear));
    const open = node('a', 'button small quiet');
    open.href = '/wait/' + encodeURIComponent(id);
    open.target = '_blank';
    open.rel = 'noopener';
    open.dataset.i18n = 'open';
    open.textContent = t('open');
    const del = node('button', 'button small danger delete');
    del.type = 'button';
    del.addEventListener('click', () => deleteEvent(id, del));
    actions.append(pause, edit, clear, open, del);
    Object.assign(refs, { pause, clear, del });

    root.append(head, figs, charts, actions, saleBox(id, refs));
    return { root, refs, armed: 0, armedDelete: 0, armedEnd: 0 };
  }

  // The announcement and the end of the sale: one message in two languages, sent as an
  // announcement or with the end. Ending is armed like Clear (a second click within five
  // seconds confirms), since it cannot be undone.
  function saleBox(id, refs) {
    const box = node('details', 'sale');
    const sum = node('summary', '', t('sale'));
    sum.dataset.i18n = 'sale';
    box.append(sum);
    const text = (key, cls) => {
      const label = node('label', 'sale-field');
      const span = node('span', '', t(key));
      span.dataset.i18n = key;
      const area = node('textarea', cls);
      area.rows = 2;
      area.maxLength = 500;
      label.append(span, area);
      box.append(label);
      return area;
    };
    const ko = text('saleMsgKo', 'sale-ko');
    const en = text('saleMsgEn', 'sale-en');
    const message = () => {
      const m = {};
      if (ko.value.trim()) m.ko = ko.value.trim();
      if (en.value.trim()) m.en = en.value.trim();
      return m;
    };
    const row = node('div', 'card-actions');
    const button = (key, cls, fn) => {
      const b = node('button', 'button small ' + cls, t(key));
      b.type = 'button';
      b.dataset.i18n = key;
      b.addEventListener('click', () => fn(b));
      row.append(b);
      return b;
    };
    const path = '/api/v1/admin/events/' + encodeURIComponent(id);
    button('announce', 'announce', async () => {
      const r = await api('POST', path + '/announcement', { token, body: { message: message() } });
      if (!r.ok) { failed(r); return; }
      toast(t('announced', { id }));
    });
    button('unannounce', 'quiet unannounce', async () => {
      const r = await api('DELETE', path + '/announcement', { token });
      if (!r.ok) { failed(r); return; }
      toast(t('unannounced', { id }));
    });
    const reason = node('select', 'end-reason');
    for (const v of ['sold_out', 'closed', 'cancelled']) {
      const k = 'r' + v[0].toUpperCase() + v.slice(1);
      const o = node('option', '', t(k));
      o.dataset.i18n = k; // (and the label below) follow a language switch
      o.value = v;
      reason.append(o);
    }
    reason.setAttribute('aria-label', t('endReason'));
    reason.dataset.i18nLabel = 'endReason';
    row.append(reason);
    refs.end = button('endSale', 'danger end', async (b) => {
      const c = cards.get(id);
      const e = events.find((x) => x.event_id === id);
      if (!c || !e) return;
      if (!c.armedEnd || Date.now() > c.armedEnd) {
        c.armedEnd = Date.now() + 5000;
        b.textContent = t('confirmEnd', { n: WR.num(e.waiting) });
        b.classList.add('armed');
        return;
      }
      c.armedEnd = 0;
      const m = message();
      const body = { reason: reason.value };
      if (m.ko || m.en) body.message = m;
      const r = await api('POST', path + '/end', { token, body });
      if (!r.ok) { failed(r); return; }
      toast(t('endedMsg', { id }));
      poll();
    });
    box.append(row);
    return box;
  }

  function chart(parent, titleKey, cls) {
    const box = node('figure', 'chart ' + cls);
    const h = node('h3', '', t(titleKey));
    h.dataset.i18n = titleKey;
    const svg = document.createElementNS(SVG_NS, 'svg');
    svg.setAttribute('viewBox', '0 0 320 120');
    svg.setAttribute('role', 'img');
    box.append(h, svg);
    parent.append(box);
    return { svg, titleKey };
  }

  // Writes what changed since the card was last written (the figures, its state, the
  // language; every time while a button waits for its confirmation), and draws the charts
  // of a card in view.
  function updateCard(c, e) {
    const over = e.ended || (e.closes_at && Date.parse(e.closes_at) <= Date.now());
    const state = over ? 'ended' : !e.accept_joins ? 'closed' : e.paused ? 'paused' : 'admitting';
    const shown = [WR.lang(), e.name, state, e.paused, e.waiting, e.admitted, e.active, e.capacity,
      e.admitted_last_minute, e.avg_wait_sec, e.completed, e.expired].join('\u0001');
    if (shown !== c.shown || c.armed || c.armedEnd || c.armedDelete) {
      c.shown = shown;
      writeCard(c, e, state);
    }
    if (onScreen.has(e.event_id)) drawCharts(c, e.event_id);
  }

  function writeCard(c, e, state) {
    const r = c.refs;
    r.name.textContent = e.name || e.event_id;
    r.pill.className = 'pill ' + state;
    r.pill.textContent = t(state);
    r.waiting.textContent = WR.num(e.waiting);
    r.admitted.textContent = WR.num(e.admitted);
    r.active.textContent = WR.num(e.active);
    r.capacity.textContent = WR.num(e.capacity);
    r.perMin.textContent = WR.num(e.admitted_last_minute);
    r.avgWait.textContent = secs(e.avg_wait_sec);
    r.completed.textContent = WR.num(e.completed);
    r.expired.textContent = WR.num(e.expired);
    r.pause.textContent = t(e.paused ? 'resume' : 'pause');
    r.pause.dataset.paused = e.paused ? 'true' : 'false';
    if (!c.armed || Date.now() > c.armed) {
      c.armed = 0;
      r.clear.textContent = t('clear');
      r.clear.classList.remove('armed');
    }
    if (r.end && (!c.armedEnd || Date.now() > c.armedEnd)) {
      c.armedEnd = 0;
      r.end.textContent = t('endSale');
      r.end.classList.remove('armed');
    }
    if (!c.armedDelete || Date.now() > c.armedDelete) {
      c.armedDelete = 0;
      r.del.textContent = t('del');
      r.del.classList.remove('armed');
    }
  }

  function drawCharts(c, id) {
    const h = history.get(id) || [];
    draw(c.refs.chartQueue, h, (p) => p.q);
    draw(c.refs.chartRate, h, (p) => p.a);
  }

  // A line chart with a light area under it, a zero line, a top line labelled with the
  // scale, and the time span along the bottom. Hand-drawn: a polyline in a 320×120 box.
  function draw(ch, h, value) {
    const svg = ch.svg;
    svg.replaceChildren();
    const W = 320, H = 120, L = 34, R = 6, T = 8, B = 18;
    const add = (tag, attrs, text) => {
      const n = document.createElementNS(SVG_NS, tag);
      for (const k of Object.keys(attrs)) n.setAttribute(k, attrs[k]);
      if (text !== undefined) n.textContent = text;
      svg.append(n);
      return n;
    };
    const values = h.map(value);
    // What the chart holds, for tests and tools: how many points, since when.
    svg.dataset.points = String(h.length);
    svg.dataset.from = h.length ? String(h[0].t) : '';
    const max = niceMax(Math.max(1, ...values));
    svg.setAttribute('aria-label', t(ch.titleKey) + ': ' + (values.length ? WR.num(values[values.length - 1]) : '–'));
    add('line', { x1: L, x2: W - R, y1: T, y2: T, class: 'axis' });
    add('line', { x1: L, x2: W - R, y1: H - B, y2: H - B, class: 'axis' });
    add('text', { x: L - 6, y: T + 4, 'text-anchor': 'end', class: 'tick' }, WR.num(max));
    add('text', { x: L - 6, y: H - B + 4, 'text-anchor': 'end', class: 'tick' }, '0');
    if (h.length < 2) {
      add('text', { x: (L + W - R) / 2, y: H / 2, 'text-anchor': 'middle', class: 'tick' }, t('collecting'));
      return;
    }
    // The window grows with the data (at least 10 s) up to ten minutes, then scrolls.
    const now = Date.now();
    const span = Math.min(HISTORY_MS, Math.max(10 * 1000, now - h[0].t));
    const x = (ts) => L + ((ts - (now - span)) / span) * (W - L - R);
    const y = (v) => H - B - (v / max) * (H - T - B);
    // A time the server was down (no samples) is a gap, not a straight line across it.
    const gapMs = Math.max(35 * 1000, 3 * historyStep() * 1000);
    const segments = [];
    h.forEach((p, i) => {
      if (i === 0 || p.t - h[i - 1].t > gapMs) segments.push([]);
      segments[segments.length - 1].push([x(p.t).toFixed(1), y(value(p)).toFixed(1)]);
    });
    let line = '';
    let area = '';
    for (const pts of segments) {
      const l = pts.map((p, i) => (i ? 'L' : 'M') + p[0] + ',' + p[1]).join(' ');
      line += l + ' ';
      area += l + ' L' + pts[pts.length - 1][0] + ',' + (H - B) + ' L' + pts[0][0] + ',' + (H - B) + ' Z ';
    }
    add('path', { d: area.trim(), class: 'area' });
    add('path', { d: line.trim(), class: 'line' });
    const ago = span < 90 * 1000 ? t('agoSec', { s: Math.round(span / 1000) })
      : span < 3 * 3600 * 1000 ? t('ago', { m: Math.round(span / 60000) })
        : '−' + t('durHour', { h: Math.floor(span / 3600000), m: Math.round(span / 60000) % 60 });
    add('text', { x: L, y: H - 4, class: 'tick' }, ago);
    add('text', { x: W - R, y: H - 4, 'text-anchor': 'end', class: 'tick' }, t('now'));
  }

  function niceMax(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  // ---- actions -----------------------------------------------------------------------------

  // A short confirmation under the summary; it fades after a few seconds.
  let toastTimer = null;
  function toast(msg) {
    const n = el('toast');
    n.textContent = msg;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { n.textContent = ''; }, 6000);
  }

  function failed(r) {
    toast(explain(r).text);
  }

  async function togglePause(id) {
    const e = events.find((x) => x.event_id === id);
    if (!e) return;
    const action = e.paused ? 'resume' : 'pause';
    const r = await api('POST', '/api/v1/admin/events/' + encodeURIComponent(id) + '/' + action, { token });
    if (!r.ok) { failed(r); return; }
    toast(t(action === 'pause' ? 'pausedMsg' : 'resumedMsg', { id }));
    poll();
  }

  // Clearing removes every waiting person: the first click arms the button for five
  // seconds, the second one clears. No modal dialog to trap keyboard or screen reader users.
  // With nobody waiting there is nothing to lose, so one click does it. Who waits is asked
  // at the click, not taken from the last refresh (up to 1.5 s old: people who joined since
  // were cleared without a word); a confirmation armed for fewer people than now wait asks
  // again, with the new count.
  async function clearLine(id, button) {
    const c = cards.get(id);
    if (!c) return;
    const now = await api('GET', '/api/v1/admin/events/' + encodeURIComponent(id), { token });
    if (!now.ok) { failed(now); return; }
    const waiting = now.data.waiting;
    const armed = c.armed && Date.now() <= c.armed;
    if (waiting > 0 && (!armed || waiting > c.armedFor)) {
      c.armed = Date.now() + 5000;
      c.armedFor = waiting;
      button.textContent = t('confirmClear', { n: WR.num(waiting) });
      button.classList.add('armed');
      return;
    }
    c.armed = 0;
    const r = await api('POST', '/api/v1/admin/events/' + encodeURIComponent(id) + '/clear', { token });
    if (!r.ok) { failed(r); return; }
    toast(t('cleared', { n: WR.num(r.data.cleared), id }));
    poll();
  }

  // Deleting an event ends every place in it and cannot be undone: armed like Clear, always.
  async function deleteEvent(id, button) {
    const c = cards.get(id);
    if (!c) return;
    if (!c.armedDelete || Date.now() > c.armedDelete) {
      c.armedDelete = Date.now() + 5000;
      button.textContent = t('confirmDelete', { id });
      button.classList.add('armed');
      return;
    }
    c.armedDelete = 0;
    const r = await api('DELETE', '/api/v1/admin/events/' + encodeURIComponent(id), { token });
    if (!r.ok) { failed(r); return; }
    toast(t('deleted', { id }));
    poll();
  }

  const FIELDS = ['name', 'max_active', 'overbooking_ratio', 'admit_per_minute', 'max_queue_length',
    'ready_ttl_sec', 'waiting_idle_sec', 'session_idle_sec', 'session_max_sec', 'target_url'];
  const NULLABLE = new Set(['admit_per_minute', 'max_queue_length', 'target_url']);
  // The look: texts in two languages, and three plain settings; every one nullable.
  const TEXTS = ['title', 'headline', 'note', 'turn_message'];
  const LOOK = ['theme_color', 'logo_url', 'stylesheet'];
  // The form's label of each API field, for errors that name it.
  const LABELS = {
    event_id: 'fEventId', name: 'fName', max_active: 'fMaxActive', overbooking_ratio: 'fOver',
    admit_per_minute: 'fRate', max_queue_length: 'fMaxQueue', ready_ttl_sec: 'fReady',
    waiting_idle_sec: 'fWaitIdle', session_idle_sec: 'fSessIdle', session_max_sec: 'fSessMax',
    target_url: 'fTarget', 'title.ko': 'fTitleKo', 'title.en': 'fTitleEn', 'headline.ko': 'fHeadlineKo',
    'headline.en': 'fHeadlineEn', 'note.ko': 'fNoteKo', 'note.en': 'fNoteEn', 'turn_message.ko': 'fTurnKo',
    'turn_message.en': 'fTurnEn', theme_color: 'fTheme', logo_url: 'fLogo', stylesheet: 'fSheet',
    'message.ko': 'saleMsgKo', 'message.en': 'saleMsgEn',
  };
  const inputOf = (field) => el('f-' + field.replace('.', '-'));

  // An error answer in the page's language: the server's messages start with the API field
  // they are about ("max_active must be between 1 and …"); that becomes the form's label and
  // the rest one of a few known shapes. {text, field}.
  function explain(r) {
    if (!r.data || !r.data.error) return { text: t('unreachable'), field: null };
    const m = String(r.data.error.message || '');
    // "field must …", or "field: invalid type: …" (a value of the wrong type).
    const head = m.split(' ')[0].replace(/:$/, '');
    const field = LABELS[head] ? head : null;
    if (!field) {
      if (/^require_user_token/.test(m)) return { text: t('eNeedsKey'), field: null };
      return { text: t('eGeneric', { m }), field: null };
    }
    const label = t(LABELS[field]);
    const rest = m.slice(m.indexOf(' ') + 1);
    let match;
    if ((match = /^must be between (\S+) and (\S+)/.exec(rest))) return { text: t('eBetween', { label, a: match[1], b: match[2] }), field };
    if ((match = /^must be at most (\d+) characters/.exec(rest))) return { text: t('eAtMost', { label, n: match[1] }), field };
    if (/control characters/.test(rest)) return { text: t('eControl', { label }), field };
    const shapes = { theme_color: 'eColor', logo_url: 'eLogo', stylesheet: 'eSheet', target_url: 'eTarget', event_id: 'badId' };
    if (shapes[field]) return { text: t(shapes[field], { label }), field };
    return { text: t('eInvalid', { label }), field };
  }

  function formError(text, field) {
    el('form-error').textContent = text;
    for (const n of el('event-form').querySelectorAll('[aria-invalid]')) n.removeAttribute('aria-invalid');
    const input = field && inputOf(field);
    if (input) { input.setAttribute('aria-invalid', 'true'); input.focus(); }
  }

  function fillForm(id) {
    const e = events.find((x) => x.event_id === id);
    if (!e) return;
    el('f-event_id').value = e.event_id;
    for (const f of FIELDS) el('f-' + f).value = e[f] === null || e[f] === undefined ? '' : e[f];
    for (const f of TEXTS) {
      for (const l of ['ko', 'en']) el('f-' + f + '-' + l).value = (e[f] && e[f][l]) || '';
    }
    for (const f of LOOK) el('f-' + f).value = e[f] || '';
    el('f-paused').checked = !!e.paused;
    el('f-accept_joins').checked = e.accept_joins !== false;
    el('editor').open = true;
    const still = matchMedia('(prefers-reduced-motion: reduce)').matches;
    el('editor').scrollIntoView({ behavior: still ? 'auto' : 'smooth', block: 'start' });
    el('f-name').focus({ preventScroll: true });
    preview();
  }

  el('event-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    formError('', null);
    const id = el('f-event_id').value.trim();
    if (!/^[A-Za-z0-9._-]{1,64}$/.test(id) || /^\.+$/.test(id)) { formError(t('badId'), 'event_id'); return; }
    const body = { paused: el('f-paused').checked, accept_joins: el('f-accept_joins').checked };
    for (const f of FIELDS) {
      const input = el('f-' + f);
      // A number the browser cannot read ("30e") reads as '': that must not clear a cap.
      if (input.validity.badInput) { formError(t('eNumber', { label: t(LABELS[f]) }), f); return; }
      const raw = input.value.trim();
      if (raw === '') { if (NULLABLE.has(f)) body[f] = null; continue; }
      if (f === 'name' || f === 'target_url') { body[f] = raw; continue; }
      const n = Number(raw);
      if (!Number.isFinite(n)) { formError(t('eNumber', { label: t(LABELS[f]) }), f); return; }
      body[f] = n;
    }
    Object.assign(body, lookBody());
    const r = await api('PUT', '/api/v1/admin/events/' + encodeURIComponent(id), { token, body });
    if (!r.ok) { const x = explain(r); formError(x.text, x.field); return; }
    toast(t('saved', { id }));
    poll();
  });

  function lookBody() {
    const body = {};
    for (const f of TEXTS) {
      const v = {};
      for (const l of ['ko', 'en']) {
        const raw = el('f-' + f + '-' + l).value.trim();
        if (raw) v[l] = raw;
      }
      body[f] = Object.keys(v).length ? v : null;
    }
    for (const f of LOOK) body[f] = el('f-' + f).value.trim() || null;
    return body;
  }

  // ---- the look's live preview ---------------------------------------------------------------

  // A small copy of the waiting page, redrawn on every keystroke in the form, in the
  // dashboard's language. The colour is set through the CSS object model (the policy allows
  // no inline style attribute), scoped to the preview.
  function preview() {
    const look = lookBody();
    const pick = (v) => WR.pick(v);
    const name = el('f-name').value.trim() || el('f-event_id').value.trim();
    el('pv-title').textContent = pick(look.title) || name || t('pvDefaultTitle');
    const headline = pick(look.headline);
    el('pv-headline').textContent = headline;
    show('pv-headline', !!headline);
    const note = pick(look.note);
    el('pv-note').textContent = note;
    show('pv-note', !!note);
    const box = el('preview');
    const color = look.theme_color;
    if (color && /^#[0-9a-fA-F]{6}$/.test(color)) {
      box.style.setProperty('--accent', color);
      // Whichever of near-black and white contrasts more, as the server picks it.
      const l = luminance(color);
      box.style.setProperty('--accent-text', (l + 0.05) / (luminance('#111111') + 0.05) >= 1.05 / (l + 0.05) ? '#111111' : '#ffffff');
      box.style.setProperty('--accent-soft', 'color-mix(in srgb, ' + color + ' 14%, var(--card))');
      box.style.setProperty('--accent-ink', ink(color.toLowerCase()));
      el('f-theme_pick').value = color.toLowerCase();
    } else {
      for (const p of ['--accent', '--accent-text', '--accent-soft', '--accent-ink']) box.style.removeProperty(p);
    }
    const logo = el('pv-logo');
    const url = look.logo_url;
    if (url && (/^https:\/\//.test(url) || /^\/branding\/[A-Za-z0-9_-][A-Za-z0-9._-]*$/.test(url))) {
      if (logo.getAttribute('src') !== url) logo.src = url;
      logo.hidden = false;
    } else {
      logo.hidden = true;
      logo.removeAttribute('src');
    }
    el('pv-bar').style.width = '62%';
  }

  // WCAG relative luminance, as the server computes it for the page's theme.
  // The waiting page's ink for the colour in this scheme, as theme.css computes it
  // (look.rs `ink`): the colour moved toward black (light) or white (dark) until it reads
  // at 4.5:1 on the scheme's backgrounds and on the colour's tint behind the position.
  function ink(hex) {
    const dark = window.matchMedia('(prefers-color-scheme: dark)').matches;
    const [bg, card, pct, to] = dark ? ['#0e131b', '#161d29', 22, 255] : ['#f3f5f9', '#ffffff', 14, 0];
    const rgb = (h) => [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16));
    const hx = (c) => '#' + c.map((v) => Math.round(v).toString(16).padStart(2, '0')).join('');
    const mix = (a, b, p) => a.map((v, i) => (v * p) / 100 + b[i] * (1 - p / 100));
    const ratio = (a, b) => {
      const x = luminance(hx(a)), y = luminance(hx(b));
      return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05);
    };
    const base = rgb(hex);
    const grounds = [rgb(bg), rgb(card), mix(base, rgb(card), pct)];
    for (let step = 0; step <= 100; step++) {
      const c = mix([to, to, to], base, step).map(Math.round);
      if (grounds.every((g) => ratio(c, g) >= 4.5)) return hx(c);
    }
    return hx([to, to, to]);
  }

  function luminance(hex) {
    const c = (i) => {
      const v = parseInt(hex.slice(i, i + 2), 16) / 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    };
    return 0.2126 * c(1) + 0.7152 * c(3) + 0.0722 * c(5);
  }

  el('f-theme_pick').addEventListener('input', () => { el('f-theme_color').value = el('f-theme_pick').value; preview(); });
  el('event-form').addEventListener('input', preview);
  el('event-form').addEventListener('reset', () => setTimeout(() => { formError('', null); preview(); }, 0));

  // ---- the server's defaults -----------------------------------------------------------------

  // A new event gets the server's default for every field left empty: the form shows them
  // as placeholders, and the hints say so.
  let defaults = null;
  async function loadDefaults() {
    if (defaults || !token) return;
    const r = await api('GET', '/api/v1/admin/defaults', { token });
    if (!r.ok) return;
    defaults = r.data;
    showDefaults();
  }

  function showDefaults() {
    if (!defaults) return;
    for (const f of FIELDS) {
      if (f === 'name' || f === 'target_url') continue;
      const v = defaults[f];
      const input = el('f-' + f);
      input.placeholder = v === null || v === undefined ? '–' : String(v);
      input.title = v === null || v === undefined ? t('noCap') : t('defaultIs', { v });
    }
  }

  // ---- history from the server, CSV export, audit list ---------------------------------------

  // Seeds an event's chart with the server's samples of the window (thinned to about 360
  // points), keeping the points this page polled itself since.
  // Seconds between the server samples asked for the current window.
  function historyStep() { return Math.max(10, Math.ceil(HISTORY_MS / 1000 / 360 / 10) * 10); }

  async function loadHistory(id) {
    const span = HISTORY_MS;
    const since = Date.now() - span;
    const step = historyStep();
    const r = await api('GET', '/api/v1/admin/events/' + encodeURIComponent(id) + '/history?since=' + since + '&step=' + step, { token });
    const c = cards.get(id);
    // The window changed meanwhile: the card is asked for again with the new one.
    if (!c || span !== HISTORY_MS) return;
    if (!r.ok || !r.data || !Array.isArray(r.data.samples)) {
      c.historyFor = 0; // asked for again when the card next comes into view
      return;
    }
    const past = r.data.samples.map((s) => ({ t: s.at, q: s.waiting, a: s.admitted_last_minute }));
    const own = history.get(id) || [];
    const firstOwn = own.length ? own[0].t : Infinity;
    history.set(id, past.filter((p) => p.t < firstOwn).concat(own));
    // For tests and tools: this card's charts hold the server's history.
    c.root.dataset.history = 'loaded';
    if (onScreen.has(id)) drawCharts(c, id);
  }

  function addRecordActions(c, id) {
    const csv = node('button', 'button small quiet csv');
    csv.type = 'button';
    csv.dataset.i18n = 'csv';
    csv.textContent = t('csv');
    csv.addEventListener('click', () => downloadCsv(id));
    c.root.querySelector('.card-actions').append(csv);
  }

  // The export needs the token, which a plain link cannot carry: fetch it, then hand the
  // browser the file.
  async function downloadCsv(id) {
    let res;
    try {
      res = await fetch('/api/v1/admin/events/' + encodeURIComponent(id) + '/history.csv',
        { headers: { authorization: 'Bearer ' + token }, cache: 'no-store' });
    } catch (_) { toast(t('unreachable')); return; }
    if (!res.ok) {
      // The server's own words (a deleted event, a refused token, a limit), as for the
      // other actions.
      let data = null;
      try { data = await res.json(); } catch (_) { /* not JSON */ }
      failed({ ok: false, status: res.status, data });
      return;
    }
    const url = URL.createObjectURL(await res.blob());
    const a = node('a');
    a.href = url;
    a.download = 'history-' + id + '.csv';
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  el('range').addEventListener('change', () => {
    HISTORY_MS = Number(el('range').value) * 60 * 1000;
    for (const id of onScreen) historyWanted.add(id);
    askHistory();
    render();
  });

  let auditBusy = false;
  async function refreshAudit() {
    if (auditBusy) return;
    auditBusy = true;
    const r = await api('GET', '/api/v1/admin/audit?limit=20', { token });
    auditBusy = false;
    if (!r.ok || !Array.isArray(r.data)) return;
    const list = el('audit-list');
    list.replaceChildren(...r.data.map(auditItem));
    show('audit-empty', r.data.length === 0);
  }

  const ACTION_KEY = { create: 'aCreate', update: 'aUpdate', pause: 'aPause', resume: 'aResume', clear: 'aClear', delete: 'aDelete', invites: 'aInvites', inventory: 'aInventory', announce: 'aAnnounce', end: 'aEnd' };

  function auditItem(x) {
    const li = node('li');
    const when = new Date(x.at);
    const sameDay = when.toDateString() === new Date().toDateString();
    const time = node('time', 'muted', sameDay ? when.toLocaleTimeString(WR.locale()) : when.toLocaleString(WR.locale()));
    time.dateTime = when.toISOString();
    const what = node('span', 'audit-what');
    const strong = node('strong', '', x.event_id);
    what.append(strong, ' ' + t(ACTION_KEY[x.action] || x.action));
    li.append(time, what);
    let detail = '';
    if (x.action === 'update') {
      detail = (x.changes || []).map((c) => c.field + ': ' + JSON.stringify(c.old) + ' → ' + JSON.stringify(c.new)).join(', ');
    } else if (x.action === 'clear') {
      detail = t('nCleared', { n: WR.num(x.count || 0) });
    } else if (x.action === 'end') {
      const c = (x.changes || [])[0];
      detail = c && c.new && c.new.reason ? c.new.reason : '';
    } else if (x.action === 'invites') {
      detail = t('nInvites', { n: WR.num(x.count || 0) });
    }
    if (detail) li.append(node('span', 'audit-detail', detail));
    if (x.client) li.append(node('span', 'muted audit-client', t('from', { c: x.client })));
    li.dataset.action = x.action;
    return li;
  }

  WR.setup(TEXT, () => { document.title = t('brand'); if (token) { render(); refreshAudit(); } showDefaults(); preview(); });
  signedIn(!!token);
})();

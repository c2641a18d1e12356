// The demo event's protected site. It does what a real booking site does with waitroom:
// takes ?waitroom_token=, verifies it (POST /queue/verify), keeps the session alive while
// the person books (POST /session/heartbeat), books through the site's own route that
// checks the token offline (POST /demo/booking/order, behind waitroom-guard), and ends the
// session when they are done (POST /session/complete), which hands the slot to the next
// person at once.
'use strict';

(() => {
  const TEXT = {
    en: {
      brand: 'Demo booking', checking: 'Checking your access…', verified: '✓ Access verified',
      welcome: 'Choose your seats', welcomeLead: 'Your turn came: the seats below are held for you while you book.',
      left: 'Session time left: {t}', pick: 'Choose your seats',
      floor: 'Floor, standing', balcony: 'Balcony, seated', complete: 'Complete booking',
      doneTitle: 'Booking complete', doneLead: 'Thank you! Your seats are booked and your place was handed to the next person.',
      invalid: 'This link is not valid', invalidLead: 'The access token is missing, expired, or its session has ended. Please join the line again.',
      back: 'Back to the start', rejoin: 'Go to the waiting room', failed: 'Could not complete the booking. Please try again.',
      demoNote: 'This is the built-in demo site: nothing is charged.', title: 'Demo booking',
      alreadyTitle: 'You have already booked', alreadyLead: 'Thank you! This booking is complete and your seats are yours. There is nothing more to do here.',
      seatHelp: 'Tap a seat to hold it; tap it again to let it go.', free: 'Free', yours: 'Held for you', taken: 'Taken',
      held: 'Held for you: {s} (for {t})', noneHeld: 'No seats held yet.', buy: 'Buy {n} seat{p}', seatTaken: 'Someone else has just taken that seat.',
      tooMany: 'You cannot hold more seats.', seat: 'Seat {s}',
    },
    ko: {
      brand: '데모 예매', checking: '입장 권한을 확인하는 중…', verified: '✓ 입장이 확인되었습니다',
      welcome: '좌석을 선택하세요', welcomeLead: '차례가 되었습니다. 예매하는 동안 아래 좌석이 확보되어 있습니다.',
      left: '남은 세션 시간: {t}', pick: '좌석 선택',
      floor: '플로어 스탠딩', balcony: '발코니 지정석', complete: '예매 완료하기',
      doneTitle: '예매가 완료되었습니다', doneLead: '감사합니다! 좌석이 예매되었고, 자리는 다음 분께 넘어갔습니다.',
      invalid: '유효하지 않은 링크입니다', invalidLead: '입장 토큰이 없거나 만료되었거나 세션이 끝났습니다. 다시 줄을 서 주세요.',
      back: '처음으로', rejoin: '대기실로 가기', failed: '예매를 완료하지 못했습니다. 다시 시도해 주세요.',
      demoNote: '내장 데모 사이트입니다. 실제로 결제되지 않습니다.', title: '데모 예매',
      alreadyTitle: '이미 예매를 마쳤습니다', alreadyLead: '감사합니다! 예매가 완료되어 좌석이 확보되었습니다. 더 하실 일은 없습니다.',
      seatHelp: '좌석을 누르면 확보되고, 다시 누르면 풀립니다.', free: '선택 가능', yours: '내 좌석', taken: '선택 불가',
      held: '확보한 좌석: {s} ({t} 남음)', noneHeld: '아직 확보한 좌석이 없습니다.', buy: '{n}석 구매하기', seatTaken: '방금 다른 분이 그 좌석을 선택했습니다.',
      tooMany: '더 이상 좌석을 확보할 수 없습니다.', seat: '{s} 좌석',
    },
  };
  const { t, api, el, show, store, setText } = WR;
  const KEY = 'waitroom:access';
  // Set when a booking completes in this tab, so that a reload (the token is spent by then)
  // thanks the person instead of calling their link invalid.
  const DONE_KEY = 'waitroom:booked';
  let token = null;
  let claims = null;
  let phase = 'checking';
  let timer = null;
  // How far the browser's clock is ahead of the server's, in ms (see `verify`).
  let skew = 0;
  const now = () => (Date.now() - skew) / 1000;
  // The seat map (GET /session/holds): null until read, or when the event sells no seats.
  let seats = null;
  let holds = [];
  let busy = false;             // a booking is being sent

  // Take the token out of the address bar (it should not linger in history or be shared by
  // copying the URL); keep it for reloads of this tab only.
  const params = new URLSearchParams(location.search);
  // The event this site protects: the demo event, or the one named by ?event= (an event
  // whose target_url is this page with its id). Verify checks the token is for it.
  const EVENT = params.get('event') || 'demo';
  if (params.get('waitroom_token')) {
    token = params.get('waitroom_token');
    store.set('sessionStorage', KEY, token);
    params.delete('waitroom_token');
    const rest = params.toString();
    history.replaceState(null, '', location.pathname + (rest ? '?' + rest : ''));
  } else {
    token = store.get('sessionStorage', KEY);
  }

  function mmss(sec) {
    sec = Math.max(0, Math.floor(sec));
    return Math.floor(sec / 60) + ':' + String(sec % 60).padStart(2, '0');
  }

  let shown = phase;             // the phase rendered last

  function render() {
    const had = document.activeElement;
    const titles = { checking: 'checking', booking: 'welcome', done: 'doneTitle', invalid: 'invalid', booked: 'alreadyTitle' };
    const leads = { checking: '', booking: 'welcomeLead', done: 'doneLead', invalid: 'invalidLead', booked: 'alreadyLead' };
    setText('booking-status', t(titles[phase]));
    el('booking-lead').textContent = leads[phase] ? t(leads[phase]) : '';
    show('booking-form', phase === 'booking');
    show('done', phase === 'done' || phase === 'booked');
    show('invalid', phase === 'invalid');
    show('badge', phase === 'done' || phase === 'booked');
    if (claims && phase === 'booking') {
      el('session-left').textContent = t('left', { t: mmss(claims.expires_at - now()) });
    }
    renderSeats();
    const eventId = claims ? claims.event_id : booked();
    const waitUrl = eventId ? '/wait/' + encodeURIComponent(eventId) : '/';
    el('rejoin').href = waitUrl;
    el('back').href = waitUrl;
    document.title = t('title');
    // Leaving the form (Buy, an ended session) hides or removes the focused control: the
    // focus goes to the link that replaced it, else the status line, as on the waiting page.
    if (shown === 'booking' && phase !== 'booking' && (!had || had === document.body || !had.isConnected || had.closest('[hidden]'))) {
      (['back', 'rejoin'].map(el).find((a) => !a.closest('[hidden]')) || el('booking-status')).focus();
    }
    shown = phase;
  }

  // The session is over (its time ran out, or the server refuses the token): its holds
  // ended with it, so nothing is shown as held or buyable any more.
  function ended() {
    if (phase !== 'booking') return;
    clearInterval(timer);
    store.del('sessionStorage', KEY);
    seats = null;
    holds = [];
    phase = 'invalid';
    render();
  }

  // Seat ids in the order people read them, numbers by value (A-2 before A-10): the API
  // answers the inventory in string order (A-10 before A-2).
  const seatOrder = new Intl.Collator(undefined, { numeric: true });

  // Draws the seat map, one row per letter; the person's own holds and the buy button. The
  // buttons are made again only when the seats change (made each second, they lost the
  // keyboard focus); their states are set in place.
  function renderSeats() {
    const map = seats && seats.length > 0;
    show('seatmap', !!map && phase === 'booking');
    show('areas', !map);
    const box = el('seats');
    if (!map) { box.replaceChildren(); box.dataset.ids = ''; el('complete').textContent = t('complete'); return; }
    const sorted = [...seats].sort((a, b) => seatOrder.compare(a.id, b.id));
    const ids = sorted.map((s) => s.id).join();
    let line;
    if (box.dataset.ids !== ids) {
      box.dataset.ids = ids;
      box.replaceChildren();
      for (const s of sorted) {
        const [row, ...n] = s.id.split('-');
        if (!line || line.id !== 'row-' + row) {
          line = document.createElement('div');
          line.className = 'seat-row';
          line.id = 'row-' + row;
          line.innerHTML = '<span class="row-name"></span>';
          line.firstChild.textContent = row;
          box.append(line);
        }
        const b = document.createElement('button');
        b.type = 'button';
        b.dataset.seat = s.id;
        b.textContent = n.join('-') || s.id;
        line.append(b);
      }
    }
    const buttons = box.getElementsByTagName('button');
    sorted.forEach((s, i) => {
      const b = buttons[i];
      b.className = 'seat ' + (s.state === 'mine' ? 'mine' : s.state === 'available' ? 'available' : 'taken');
      b.disabled = s.state === 'held' || s.state === 'sold';
      b.setAttribute('aria-pressed', s.state === 'mine');
      b.setAttribute('aria-label', t('seat', { s: s.id }));
    });
    const mine = holds.map((h) => h.item), n = mine.length;
    const left = n ? Math.min(...holds.map((h) => h.expires_at)) / 1000 - now() : 0;
    setText('held-line', n ? t('held', { s: mine.join(', '), t: mmss(left) }) : t('noneHeld'));
    setText('complete', n ? t('buy', { n, p: n > 1 ? 's' : '' }) : t('complete'));
    // On a seat map, completing buys the seats held: with none, it would end the turn
    // with nothing bought.
    el('complete').disabled = busy || n === 0;
  }

  async function loadSeats() {
    const r = await api('GET', '/api/v1/session/holds', { token });
    if (r.status === 401) ended();
    if (!r.ok) return;
    seats = r.data.items;
    holds = r.data.holds;
    render();
  }

  // A tap holds a free seat or lets one of the person's own go; the store answers for
  // everyone at once, so a seat someone else took first is refused and the map redrawn.
  async function toggleSeat(e) {
    const b = e.target.closest('button.seat');
    if (!b || b.disabled) return;
    el('booking-error').textContent = '';
    const mine = b.classList.contains('mine');
    const r = await api(mine ? 'DELETE' : 'POST', '/api/v1/session/holds', { token, body: { items: [b.dataset.seat] } });
    if (!r.ok) {
      if (r.code === 'HOLD_CONFLICT') el('booking-error').textContent = t('seatTaken');
      else if (r.code === 'TOO_MANY_HOLDS') el('booking-error').textContent = t('tooMany');
      else if (r.status === 401) { ended(); return; }
    }
    await loadSeats();
  }

  // The event whose booking this tab completed, if it is this page's event.
  function booked() {
    const id = store.get('sessionStorage', DONE_KEY);
    return id && id === EVENT ? id : null;
  }

  async function verify() {
    if (!token) { phase = booked() ? 'booked' : 'invalid'; render(); return; }
    const r = await api('POST', '/api/v1/queue/verify?event_id=' + encodeURIComponent(EVENT), { token });
    if (!r.ok) {
      store.del('sessionStorage', KEY);
      phase = 'invalid';
      render();
      return;
    }
    store.del('sessionStorage', DONE_KEY);
    // The session's end is the server's time: a browser clock minutes fast ended a live
    // session at once. Its `Date` is whole seconds, so the count may end up to 1 s late
    // (then the server's 401 says so), never early.
    if (r.date) skew = Date.now() - r.date;
    claims = r.data;
    phase = 'booking';
    const ev = await api('GET', '/api/v1/events/' + encodeURIComponent(claims.event_id));
    if (ev.ok) el('event-name').textContent = WR.pick(ev.data.title, el('event-name')) || ev.data.name || ev.data.event_id;
    render();
    await loadSeats();
    // Countdown each second; a session heartbeat every 20 s keeps an idle session open; the
    // seat map is read again every 5 s (others hold and buy meanwhile).
    let n = 0;
    if (phase !== 'booking') return;
    timer = setInterval(() => {
      n += 1;
      if (claims.expires_at <= now()) { ended(); return; }
      if (n % 20 === 0) api('POST', '/api/v1/session/heartbeat', { token }).then((r) => { if (r.status === 401) ended(); });
      if (n % 5 === 0 && seats && seats.length) loadSeats();
      render();
    }, 1000);
  }

  async function complete(e) {
    e.preventDefault();
    if (busy || (seats && seats.length > 0 && holds.length === 0)) return;
    busy = true;
    el('complete').disabled = true;
    el('booking-error').textContent = '';
    // The site's own route, guarded by waitroom-guard (the token is verified offline from
    // the JWKS), books the seats; then the session ends so the slot goes on at once.
    const area = (document.querySelector('input[name="area"]:checked') || {}).value || 'floor';
    const order = await api('POST', '/demo/booking/order?event=' + encodeURIComponent(EVENT), { token, body: { area } });
    if (!order.ok) {
      busy = false;
      el('complete').disabled = false;
      if (order.status === 401) ended(); else el('booking-error').textContent = t('failed');
      return;
    }
    const r = await api('POST', '/api/v1/session/complete', { token });
    busy = false;
    el('complete').disabled = false;
    if (!r.ok) {
      if (r.status === 401) ended(); else el('booking-error').textContent = t('failed');
      return;
    }
    clearInterval(timer);
    store.del('sessionStorage', KEY);
    store.set('sessionStorage', DONE_KEY, claims.event_id);
    // The place in the waiting room is over; a later visit should join afresh.
    store.del('localStorage', 'waitroom:place:' + claims.event_id);
    phase = 'done';
    render();
  }

  WR.setup(TEXT, render);
  el('booking-form').addEventListener('submit', complete);
  el('seats').addEventListener('click', toggleSeat);
  verify();
})();

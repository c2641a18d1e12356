// The landing page: the events a person can join, refreshed every few seconds while shown.
'use strict';

(() => {
  const TEXT = {
    en: {
      brand: 'Waiting room', title: 'Choose an event', empty: 'No sale is open right now.',
      lead: 'Join the line of the sale you came for. Your place is kept while this page stays open.',
      inLine: '{n} in line', paused: 'paused', closed: 'not taking new people', join: 'Join the line',
      operators: 'Operator dashboard', sold_out: 'sold out', over: 'sale ended', cancelled: 'sale cancelled',
    },
    ko: {
      brand: '대기실', title: '이벤트를 선택하세요', empty: '지금 열려 있는 판매가 없습니다.',
      lead: '원하는 판매의 대기열에 들어가세요. 페이지를 열어 두는 동안 순서가 유지됩니다.',
      inLine: '{n}명 대기 중', paused: '입장 일시 중지', closed: '새 입장 받지 않음', join: '줄 서기',
      operators: '운영자 대시보드', sold_out: '매진', over: '판매 종료', cancelled: '판매 취소',
    },
  };
  const { t, api, el } = WR;
  let events = [];

  // Items are kept, only changed words set: an item made again lost the keyboard focus. (An
  // ended sale's item, keyed apart, has no link.)
  function render() {
    const list = el('events');
    const had = document.activeElement, item = had && had.closest('#events li');
    const at = item ? [...list.children].indexOf(item) : -1;
    const keyOf = (e) => e.event_id + (e.ended ? ' ' : '');
    const keys = new Set(events.map(keyOf));
    // Gone items first: one left ahead of a kept item would make placing it move it.
    for (const li of [...list.children]) if (!keys.has(li.dataset.key)) li.remove();
    const old = new Map([...list.children].map((li) => [li.dataset.key, li]));
    events.forEach((e, i) => {
      const key = keyOf(e);
      let li = old.get(key);
      if (!li) {
        li = document.createElement('li');
        li.dataset.key = key;
        li.innerHTML = '<div><strong dir="auto"></strong><span class="meta"></span></div>' + (e.ended ? '' : '<a class="button primary small"></a>');
      }
      const [name, meta, a] = li.querySelectorAll('strong,span,a');
      WR.setText(name, WR.pick(e.title, name) || e.name || e.event_id);
      let bits = [t('inLine', { n: WR.num(e.queue_length) })];
      if (e.paused) bits.push(t('paused'));
      if (!e.accept_joins) bits.push(t('closed'));
      // An ended sale (sold out, over, cancelled) takes nobody: said so, and no way to join.
      if (e.ended) {
        bits = [t({ sold_out: 'sold_out', cancelled: 'cancelled' }[e.ended.reason] || 'over')];
        li.dataset.ended = e.ended.reason;
      } else {
        a.href = '/wait/' + encodeURIComponent(e.event_id);
        WR.setText(a, t('join'));
      }
      WR.setText(meta, bits.join(' · '));
      if (list.children[i] !== li) list.insertBefore(li, list.children[i]);
    });
    el('empty').hidden = events.length > 0;
    // The focused link went with its item (its sale ended, or the event is gone): the focus
    // goes to what is in its place now, not to the page's body.
    if (at >= 0 && !had.isConnected) {
      const li = list.children[Math.min(at, list.children.length - 1)];
      const to = (li && li.querySelector('a')) || li || el('empty');
      if (to.tagName !== 'A') to.tabIndex = -1;
      to.focus();
    }
    document.title = t('brand');
  }

  async function load() {
    const r = await api('GET', '/api/v1/events');
    if (r.ok) { events = r.data; render(); }
  }

  WR.setup(TEXT, render);
  load();
  // Only while the page is seen: a tab in the background (or a phone's screen off) asks
  // nothing, and asks at once when it shows again.
  setInterval(() => { if (!document.hidden) load(); }, 5000);
  document.addEventListener('visibilitychange', () => { if (!document.hidden) load(); });
})();

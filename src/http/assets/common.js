// Shared by every waitroom page: language choice (Korean or English, from the browser,
// switchable and remembered), text lookup, number and duration formatting, and one fetch
// helper that always answers {ok, status, code, data} so pages never deal with exceptions.
'use strict';

// Marks the page as scripted: what only the script makes work (the status line it keeps,
// the language button) is hidden without it (style.css `.needs-js`).
document.documentElement.classList.add('js');

window.WR = (() => {
  const LANG_KEY = 'waitroom:lang';
  const store = {
    get(area, k) { try { return window[area].getItem(k); } catch (_) { return null; } },
    set(area, k, v) { try { window[area].setItem(k, v); } catch (_) { /* private mode */ } },
    del(area, k) { try { window[area].removeItem(k); } catch (_) { /* private mode */ } },
  };

  function pickLang() {
    const q = new URLSearchParams(location.search).get('lang');
    if (q === 'ko' || q === 'en') { store.set('localStorage', LANG_KEY, q); return q; }
    const saved = store.get('localStorage', LANG_KEY);
    if (saved === 'ko' || saved === 'en') return saved;
    // The first of the browser's languages (in its order of preference) that is one of
    // ours, as the server picks from Accept-Language.
    const langs = (navigator.languages && navigator.languages.length)
      ? navigator.languages : [navigator.language || 'en'];
    for (const l of langs) {
      const primary = String(l).toLowerCase().split('-')[0];
      if (primary === 'ko' || primary === 'en') return primary;
    }
    return 'en';
  }

  let lang = pickLang();
  let texts = { en: {}, ko: {} };
  const listeners = [];

  function t(key, vars) {
    let s = texts[lang][key];
    if (s === undefined) s = texts.en[key];
    if (s === undefined) s = key;
    if (vars) for (const k of Object.keys(vars)) s = s.split('{' + k + '}').join(String(vars[k]));
    return s;
  }

  function apply() {
    document.documentElement.lang = lang;
    for (const el of document.querySelectorAll('[data-i18n]')) el.textContent = t(el.dataset.i18n);
    for (const el of document.querySelectorAll('[data-i18n-placeholder]')) {
      el.placeholder = t(el.dataset.i18nPlaceholder);
    }
    for (const el of document.querySelectorAll('[data-i18n-label]')) {
      el.setAttribute('aria-label', t(el.dataset.i18nLabel));
    }
    const btn = document.getElementById('lang');
    if (btn) {
      // The button names the *other* language, in that language.
      btn.textContent = lang === 'ko' ? 'English' : '한국어';
      btn.lang = lang === 'ko' ? 'en' : 'ko';
      // Its accessible name holds its visible word as a word of its own: a voice-control user
      // says what the button shows.
      btn.setAttribute('aria-label', lang === 'ko' ? 'Switch to English' : '한국어 보기');
    }
    for (const f of listeners) f(lang);
  }

  function setup(dict, onChange) {
    texts = dict;
    if (onChange) listeners.push(onChange);
    const btn = document.getElementById('lang');
    if (btn) {
      btn.addEventListener('click', () => {
        lang = lang === 'ko' ? 'en' : 'ko';
        store.set('localStorage', LANG_KEY, lang);
        apply();
      });
    }
    apply();
  }

  function locale() { return lang === 'ko' ? 'ko-KR' : 'en-US'; }

  // One formatter per language: making one is slow, and the dashboard formats thousands
  // of figures at a time.
  const formats = {};
  function num(n) {
    if (n === null || n === undefined || Number.isNaN(n)) return '–';
    const l = locale();
    if (!formats[l]) formats[l] = new Intl.NumberFormat(l);
    return formats[l].format(n);
  }

  // "about 3 min" / "약 3분": waits are estimates, so they are rounded up to whole minutes.
  function duration(sec) {
    sec = Math.max(0, Math.round(sec || 0));
    if (sec < 60) return t('durSoon');
    const mins = Math.ceil(sec / 60);
    if (mins < 60) return t('durMin', { m: mins });
    return t('durHour', { h: Math.floor(mins / 60), m: mins % 60 });
  }

  // One call to the API. `token` goes to `Authorization: Bearer`.
  async function api(method, path, opts = {}) {
    const headers = {};
    let body;
    if (opts.body !== undefined) {
      headers['content-type'] = 'application/json';
      body = JSON.stringify(opts.body);
    }
    if (opts.token) headers.authorization = 'Bearer ' + opts.token;
    let res;
    try {
      res = await fetch(path, { method, headers, body, cache: 'no-store' });
    } catch (_) {
      return { ok: false, status: 0, code: 'NETWORK', data: null };
    }
    let data = null;
    try { data = await res.json(); } catch (_) { /* empty body */ }
    const code = !res.ok && data && data.error ? data.error.code : null;
    const retry = Number(res.headers.get('retry-after')) || null;
    // The server's clock (to the second), for countdowns to its absolute times.
    const date = Date.parse(res.headers.get('date')) || null;
    return { ok: res.ok, status: res.status, code, data, retry, date };
  }

  // One of an event's texts ({ko, en}, either may be missing) in the page's language, else
  // the other one; '' when there is none. Element `e` showing it gets its language.
  function pick(texts, e) {
    const o = lang === 'ko' ? 'en' : 'ko', l = texts && !texts[lang] && texts[o] ? o : lang;
    if (e) e.lang = l;
    return (texts && texts[l]) || '';
  }

  function el(id) { return document.getElementById(id); }

  // Sets a text only when it differs: a live region speaks on every change, even to the same
  // words.
  function setText(e, text) {
    if (typeof e === 'string') e = el(e);
    if (e.textContent !== text) e.textContent = text;
  }

  function show(id, visible) { const e = el(id); if (e) e.hidden = !visible; }

  return { t, setup, apply, num, duration, api, el, show, store, pick, setText, lang: () => lang, locale };
})();

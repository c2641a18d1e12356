//! The report as one self-contained HTML page: the promises as numbers with their goals,
//! and charts as inline SVG written here (no script, no external resource).

use std::fmt::Write as _;

use super::report::{ghost_goals, opt, Report, ETA_GOAL};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step giving about `n` ticks over `0..max`.
fn nice_step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

struct Series<'a> {
    name: &'a str,
    color: &'a str,
    points: Vec<(f64, f64)>,
    dashed: bool,
}

const W: f64 = 860.0;
const H: f64 = 260.0;
const L: f64 = 56.0;
const R: f64 = 16.0;
const T: f64 = 30.0;
const B: f64 = 34.0;

/// Axes, grid and labels of a chart over `0..xmax` × `0..ymax`; answers the mapping.
fn frame(out: &mut String, xmax: f64, ymax: f64, xlabel: &str, ylabel: &str) -> (f64, f64) {
    let (pw, ph) = (W - L - R, H - T - B);
    let _ = write!(
        out,
        r##"<svg viewBox="0 0 {W} {H}" width="100%" role="img" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">"##
    );
    let ys = nice_step(ymax, 5.0);
    let mut y = 0.0;
    while y <= ymax + 1e-9 {
        let py = T + ph - y / ymax * ph;
        let _ = write!(
            out,
            r##"<line x1="{L}" x2="{:.1}" y1="{py:.1}" y2="{py:.1}" stroke="#e3e3e3"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{}</text>"##,
            L + pw,
            L - 6.0,
            py + 4.0,
            trim(y)
        );
        y += ys;
    }
    let xs = nice_step(xmax, 10.0);
    let mut x = 0.0;
    while x <= xmax + 1e-9 {
        let px = L + x / xmax * pw;
        let _ = write!(
            out,
            r##"<line x1="{px:.1}" x2="{px:.1}" y1="{T}" y2="{:.1}" stroke="#f0f0f0"/><text x="{px:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            T + ph,
            T + ph + 14.0,
            trim(x)
        );
        x += xs;
    }
    let _ = write!(
        out,
        r##"<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#999"/><text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#333">{}</text><text x="12" y="{:.1}" transform="rotate(-90 12 {:.1})" text-anchor="middle" fill="#333">{}</text>"##,
        L + pw / 2.0,
        H - 4.0,
        esc(xlabel),
        T + ph / 2.0,
        T + ph / 2.0,
        esc(ylabel)
    );
    (pw / xmax, ph / ymax)
}

fn trim(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

fn line_chart(series: &[Series], xlabel: &str, ylabel: &str) -> String {
    let xmax = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let ymax = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.08;
    let mut out = String::new();
    let (sx, sy) = frame(&mut out, xmax, ymax, xlabel, ylabel);
    let base = T + (H - T - B);
    for s in series {
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", L + x * sx, base - y * sy))
            .collect();
        let dash = if s.dashed {
            r#" stroke-dasharray="5 4""#
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.6"{dash} points="{}"/>"#,
            s.color,
            pts.join(" ")
        );
    }
    legend(&mut out, series.iter().map(|s| (s.name, s.color)));
    out.push_str("</svg>");
    out
}

fn legend<'a>(out: &mut String, items: impl Iterator<Item = (&'a str, &'a str)>) {
    let mut x = L;
    for (name, color) in items {
        let _ = write!(
            out,
            r##"<rect x="{x:.1}" y="10" width="12" height="4" fill="{color}"/><text x="{:.1}" y="16" fill="#333">{}</text>"##,
            x + 16.0,
            esc(name)
        );
        x += 24.0 + 6.5 * name.len() as f64;
    }
}

/// Estimates against real waits: the diagonal is a perfect estimate, the band ±20 %.
fn eta_scatter(points: &[(f64, f64)]) -> String {
    let max = points.iter().map(|p| p.0.max(p.1)).fold(1.0, f64::max) * 1.05;
    let mut out = String::new();
    let (sx, sy) = frame(&mut out, max, max, "real wait (s)", "estimate shown (s)");
    let base = T + (H - T - B);
    let p = |x: f64, y: f64| format!("{:.1},{:.1}", L + x * sx, base - y.min(max) * sy);
    let _ = write!(
        out,
        r##"<polygon points="{} {} {} {}" fill="#2a7" fill-opacity="0.12"/><polyline points="{} {}" stroke="#2a7" fill="none"/>"##,
        p(0.0, 0.0),
        p(max, max * 1.2),
        p(max, max * 0.8),
        p(0.0, 0.0),
        p(0.0, 0.0),
        p(max, max)
    );
    for &(real, est) in points {
        let _ = write!(
            out,
            r##"<circle cx="{:.1}" cy="{:.1}" r="2" fill="#36c" fill-opacity="0.5"/>"##,
            L + real * sx,
            base - est.min(max) * sy
        );
    }
    legend(
        &mut out,
        [("estimate at join", "#36c"), ("exact ±20 %", "#2a7")].into_iter(),
    );
    out.push_str("</svg>");
    out
}

fn card(out: &mut String, name: &str, value: String, goal: &str, ok: Option<bool>) {
    let (cls, mark) = match ok {
        Some(true) => ("ok", "✓"),
        Some(false) => ("bad", "✗"),
        None => ("info", ""),
    };
    let _ = write!(
        out,
        r#"<div class="card {cls}"><div class="name">{}</div><div class="value">{} <span class="mark">{mark}</span></div><div class="goal">{}</div></div>"#,
        esc(name),
        esc(&value),
        esc(goal)
    );
}

/// The sale: every seat sold once and known to its buyer, and how soon the line learnt
/// of the sell-out.
fn seats_section(o: &mut String, r: &Report) {
    let (Some(h), Some(x)) = (&r.seat_numbers, &r.seats) else {
        return;
    };
    let _ = write!(
        o,
        "<h2>Seats</h2><p>{} seats, {}–{} wanted per person, picked at random on the seat map and held all or none \
         (a person who finds fewer takes what is left; a conflict re-reads the map, {} holds at most); {}.</p><div class=\"cards\">",
        x.seats,
        x.seats_per_person[0],
        x.seats_per_person[1],
        super::seats::HOLD_TRIES,
        if x.end_when_sold_out {
            "the operator ends the sale (<code>sold_out</code>) as soon as nothing is available nor held"
        } else {
            "the sale is not ended by the run"
        }
    );
    card(
        o,
        "Seats double sold",
        h.seats_double_sold.to_string(),
        "goal 0: a seat two clients both believe they bought",
        Some(h.seats_double_sold == 0),
    );
    card(
        o,
        "Sold vs bought mismatch",
        h.seats_sold_mismatch.to_string(),
        &format!(
            "goal 0: the server's sold set against the clients' ({} sold not bought, {} bought not sold)",
            x.sold_not_bought, x.bought_not_sold
        ),
        Some(h.seats_sold_mismatch == 0),
    );
    card(
        o,
        "Seats sold (server)",
        format!("{} of {}", h.seats_sold, x.seats),
        &format!(
            "bought by clients: {} by {} people ({} took fewer than they wanted)",
            h.seats_bought_by_clients, x.buyers, x.buyers_short
        ),
        None,
    );
    card(
        o,
        "Sold out at",
        opt(h.sold_out_at_sec, 1) + " s",
        &x.sold_out.map_or("never sold out".into(), |c| {
            format!(
                "the end call, answered {:.0} ms later; {} waiting then",
                (c.answered_sec - c.sent_sec) * 1000.0,
                c.waiting
            )
        }),
        None,
    );
    card(
        o,
        "Sold-out notice p50 / p99",
        format!(
            "{} / {} s",
            opt(h.sold_out_notice_p50_sec, 2),
            opt(h.sold_out_notice_p99_sec, 2)
        ),
        &format!(
            "from the end call (or a return online) to each waiting person knowing; {} told ({} by push, {} by a status answer), max {} s",
            x.notices.told,
            x.told_by_push,
            x.told_by_status,
            opt(x.notices.max_sec, 2)
        ),
        None,
    );
    card(
        o,
        "Waiting people never told",
        x.untold.to_string(),
        "goal 0",
        x.sold_out.map(|_| x.untold == 0),
    );
    card(
        o,
        "Hold conflicts",
        h.hold_conflicts.to_string(),
        &format!(
            "in {} holds tried: someone else was faster, the map is read again",
            x.hold_attempts
        ),
        None,
    );
    card(
        o,
        "People without a seat",
        h.people_without_seats.to_string(),
        &format!(
            "entered and found none left ({} gave up after {} conflicts); {} turned away at join after the end",
            x.gave_up_on_conflicts,
            super::seats::HOLD_TRIES,
            x.closed_at_join
        ),
        None,
    );
    o.push_str("</div>");
    o.push_str("<h2>The inventory, each second (admin reads)</h2>");
    let pts = |f: fn(&super::seats::Counts) -> u64| -> Vec<(f64, f64)> {
        x.series
            .iter()
            .map(|s| (s.t.floor(), f(&s.counts) as f64))
            .collect()
    };
    o.push_str(&line_chart(
        &[
            Series {
                name: "available",
                color: "#36c",
                points: pts(|c| c.available),
                dashed: false,
            },
            Series {
                name: "held",
                color: "#e67e22",
                points: pts(|c| c.held),
                dashed: false,
            },
            Series {
                name: "sold",
                color: "#2a7",
                points: pts(|c| c.sold),
                dashed: false,
            },
        ],
        "seconds since the opening",
        "seats",
    ));
    if !x.notices_by_transport.is_empty() {
        o.push_str("<table><tr><th>told of the sell-out, by transport</th><th>people</th><th>p50 (s)</th><th>p99 (s)</th><th>max (s)</th></tr>");
        for (t, n) in &x.notices_by_transport {
            let _ = write!(
                o,
                "<tr><td>{t:?}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                n.told,
                opt(n.p50_sec, 2),
                opt(n.p99_sec, 2),
                opt(n.max_sec, 2)
            );
        }
        o.push_str("</table>");
    }
    if !x.mismatch_examples.is_empty() || !x.double_sold.is_empty() {
        let _ = write!(
            o,
            "<p>Double sold: {}. Mismatches: {}.</p>",
            esc(&x.double_sold.join(", ")),
            esc(&x.mismatch_examples.join("; "))
        );
    }
}

fn pc(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:.1} %", x * 100.0))
}

pub fn html(r: &Report) -> String {
    let sc = &r.scenario;
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>waitroom journey: {}</title><style>
body{{font-family:system-ui,sans-serif;margin:24px auto;max-width:900px;color:#222;padding:0 12px}}
h1{{font-size:22px;margin-bottom:4px}} h2{{font-size:17px;margin-top:28px}} .sub{{color:#666}}
.cards{{display:grid;grid-template-columns:repeat(4,1fr);gap:10px}}
.card{{border:1px solid #ddd;border-radius:8px;padding:10px}} .card .name{{font-size:12px;color:#555}}
.card .value{{font-size:20px;font-weight:600;margin:4px 0}} .card .goal{{font-size:11px;color:#777}}
.ok .mark{{color:#1a7f37}} .bad .mark{{color:#c62828}} .bad{{border-color:#e5a0a0}}
table{{border-collapse:collapse;font-size:13px;margin:6px 0}} td,th{{border-bottom:1px solid #eee;padding:3px 10px;text-align:right}}
th:first-child,td:first-child{{text-align:left}} code{{font-size:12px}}
</style></head><body>"#,
        esc(&r.label)
    );
    let u = &r.users;
    let _ = write!(
        o,
        r#"<h1>Flash crowd: {}</h1><div class="sub">event <code>{}</code>, {} node(s), {:.0} s run; {} people ({} % in a {} s spike, the rest over {} s), {} % polling, {} % abandon, {} % reload, {} % lose the network; capacity {} ({}), sessions {}–{} s, <code>waiting_idle_sec</code> {}{}.</div>"#,
        esc(&r.label),
        esc(&r.event),
        r.nodes,
        r.duration_sec,
        sc.users,
        (sc.spike_share * 100.0).round(),
        sc.arrival_secs,
        sc.tail_secs,
        (sc.poll_share * 100.0).round(),
        (sc.abandon_share * 100.0).round(),
        (sc.reload_share * 100.0).round(),
        (sc.netloss_share * 100.0).round(),
        r.capacity.capacity,
        sc.admit_per_minute
            .map_or("no admission pace".into(), |p| format!(
                "{p} admissions/min"
            )),
        sc.hold_secs[0],
        sc.hold_secs[1],
        sc.waiting_idle_sec,
        if r.settings_kept {
            " (the event's own settings: <code>--keep-settings</code>)"
        } else {
            ""
        }
    );

    o.push_str(r#"<h2>The promises</h2><div class="cards">"#);
    // Without it, an event that admits nobody showed only ✓ marks (every other promise
    // holds vacuously then).
    let people = r.people_check();
    card(
        &mut o,
        "People admitted",
        format!("{} of {}", u.admitted, u.joined),
        &format!(
            "goal: everyone who stays is admitted (or told the sale ended); {}",
            people.why
        ),
        people.ok,
    );
    let fifo = r.fifo_check();
    card(
        &mut o,
        "FIFO inversions (certain)",
        r.fifo_inversions.to_string(),
        &if fifo.ok.is_some() {
            "goal 0".to_string()
        } else {
            format!("goal 0; {}", fifo.why)
        },
        fifo.ok,
    );
    card(
        &mut o,
        "Kendall tau, arrival vs admission",
        opt(r.kendall_tau, 4),
        "goal 1 (observation noise lowers it)",
        None,
    );
    card(
        &mut o,
        "Capacity overshoot (max)",
        r.capacity_overshoot_max.to_string(),
        "goal 0",
        Some(r.capacity_overshoot_max == 0),
    );
    card(
        &mut o,
        "Idle slot p50 / p99",
        format!(
            "{} / {} s",
            opt(r.idle_slot_p50_sec, 2),
            opt(r.idle_slot_p99_sec, 2)
        ),
        "seconds from a completed session to the next entry, while people waited",
        None,
    );
    // A ghost ends when its heartbeat lapses, or, if its turn came first, when its ready
    // window closes. The verdict counts the ghosts never seen removed too.
    let (ghost_goal, ghost_late) = ghost_goals(sc);
    let ghosts = r.ghost_check();
    let unseen = if r.ghosts.unseen > 0 {
        format!(
            "; {} of {} never seen removed, {} of them past {ghost_late} s",
            r.ghosts.unseen, r.ghosts.silent, r.ghosts.overdue
        )
    } else {
        String::new()
    };
    card(
        &mut o,
        "Ghost removal p50 / p99",
        format!(
            "{} / {} s",
            opt(r.ghost_removal_p50_sec, 1),
            opt(r.ghost_removal_p99_sec, 1)
        ),
        &format!(
            "goal ≤ waiting_idle_sec + 5 = {ghost_goal} s (+ ready_ttl_sec = {ghost_late} s if its turn came){unseen}"
        ),
        ghosts.ok,
    );
    let eta = r.eta_check();
    card(
        &mut o,
        "ETA mean abs. % error",
        pc(r.eta_mape),
        &format!(
            "goal ≤ {:.0} % under steady admission; {}",
            ETA_GOAL * 100.0,
            eta.why
        ),
        eta.ok,
    );
    card(
        &mut o,
        "ETA within ±20 %",
        pc(r.eta_within_20pct),
        &format!(
            "{} estimates scored; {} with a range (MAPE {}), which held {}",
            r.eta.all.samples,
            r.eta.all.range_samples,
            pc(r.eta.all.ranged_mape),
            pc(r.eta.all.within_range)
        ),
        None,
    );
    let ws = r.client_cost.values().next();
    card(
        &mut o,
        "Requests per admitted person",
        r.client_cost
            .iter()
            .map(|(t, c)| format!("{:?} {}", t, opt(c.requests_per_admitted, 1)))
            .collect::<Vec<_>>()
            .join(", "),
        &format!(
            "bytes: {}",
            ws.map_or("-".into(), |_| r
                .client_cost
                .iter()
                .map(|(t, c)| format!(
                    "{:?} {}",
                    t,
                    opt(c.bytes_per_admitted.map(|b| b / 1000.0), 1)
                ))
                .collect::<Vec<_>>()
                .join(" kB, ")
                + " kB")
        ),
        None,
    );
    o.push_str("</div>");
    seats_section(&mut o, r);

    o.push_str("<h2>The line, each second (admin figures)</h2>");
    let pts = |f: fn(&super::report::Second) -> u64| -> Vec<(f64, f64)> {
        r.series.iter().map(|s| (s.t as f64, f(s) as f64)).collect()
    };
    o.push_str(&line_chart(
        &[
            Series {
                name: "waiting",
                color: "#36c",
                points: pts(|s| s.waiting),
                dashed: false,
            },
            Series {
                name: "admitted + active",
                color: "#e67e22",
                points: pts(|s| s.admitted + s.active),
                dashed: false,
            },
            Series {
                name: "capacity",
                color: "#c62828",
                points: pts(|s| s.capacity),
                dashed: true,
            },
        ],
        "seconds since the opening",
        "places",
    ));
    o.push_str("<h2>Arrivals and admissions per second (as clients saw them)</h2>");
    o.push_str(&line_chart(
        &[
            Series {
                name: "joins answered",
                color: "#36c",
                points: pts(|s| s.arrivals),
                dashed: false,
            },
            Series {
                name: "admissions seen",
                color: "#2a7",
                points: pts(|s| s.admissions),
                dashed: false,
            },
            Series {
                name: "sessions completed",
                color: "#999",
                points: pts(|s| s.completions),
                dashed: true,
            },
        ],
        "seconds since the opening",
        "per second",
    ));

    let e = &r.eta;
    let _ = write!(
        o,
        "<h2>Estimates against real waits</h2><p>At join: MAPE {}, within ±20 % {}, bias {} ({} samples). \
         Later (first estimate after each {} s of waiting): MAPE {}, within ±20 % {} ({} samples). \
         Answers with <code>poll_after_sec</code>: {}; with an estimate range: {}{}.</p>\
         <p>The page shows a figure only with a range (without one it says \"We don't know yet\"): \
         at join {} of {} estimates carried one, MAPE {}, bias {}; later {} of {}, MAPE {}, bias {}.</p>",
        pc(e.at_join.mape),
        pc(e.at_join.within_20pct),
        pc(e.at_join.bias),
        e.at_join.samples,
        sc.eta_every_sec,
        pc(e.later.mape),
        pc(e.later.within_20pct),
        e.later.samples,
        e.poll_after_answers,
        e.range_answers,
        e.all
            .within_range
            .map_or(String::new(), |w| format!(" (real wait inside the range: {})", pc(Some(w)))),
        e.at_join.range_samples,
        e.at_join.samples,
        pc(e.at_join.ranged_mape),
        pc(e.at_join.ranged_bias),
        e.later.range_samples,
        e.later.samples,
        pc(e.later.ranged_mape),
        pc(e.later.ranged_bias),
    );
    let scatter: Vec<(f64, f64)> = e
        .examples_all
        .iter()
        .map(|x| (x.real_sec, x.estimate_sec))
        .collect();
    o.push_str(&eta_scatter(&scatter));
    o.push_str("<table><tr><th>position at join</th><th>estimate (s)</th><th>real wait (s)</th><th>error</th></tr>");
    for x in &e.examples {
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{:.0}</td><td>{:.1}</td><td>{}</td></tr>",
            x.position.map_or("-".into(), |p| p.to_string()),
            x.estimate_sec,
            x.real_sec,
            if x.real_sec > 0.0 {
                format!(
                    "{:+.0} %",
                    (x.estimate_sec - x.real_sec) / x.real_sec * 100.0
                )
            } else {
                "-".into()
            }
        );
    }
    o.push_str("</table>");

    o.push_str("<h2>Latency per step (ms)</h2><table><tr><th>step</th><th>count</th><th>p50</th><th>p90</th><th>p99</th><th>max</th><th>errors</th></tr>");
    for (step, l) in &r.latency_ms {
        let _ = write!(
            o,
            "<tr><td>{step:?}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            l.count,
            opt(l.p50, 1),
            opt(l.p90, 1),
            opt(l.p99, 1),
            opt(l.max, 1),
            l.errors
        );
    }
    o.push_str("</table>");

    o.push_str("<h2>Client cost (the waiting page's requests: join, status, WebSocket, enter)</h2><table><tr><th>transport</th><th>people</th><th>admitted</th><th>requests</th><th>per admitted</th><th>bytes per admitted</th><th>live messages</th></tr>");
    for (t, c) in &r.client_cost {
        let _ = write!(
            o,
            "<tr><td>{t:?}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            c.users,
            c.admitted,
            c.requests,
            opt(c.requests_per_admitted, 1),
            opt(c.bytes_per_admitted, 0),
            c.ws_messages
        );
    }
    o.push_str("</table>");
    let _ = write!(
        o,
        "<p>Polling clients {}.</p>",
        if sc.ignore_poll_after {
            format!(
                "ignored <code>poll_after_sec</code> and polled every {} s (<code>--ignore-poll-after</code>)",
                sc.poll_secs
            )
        } else {
            format!(
                "polled at the server's <code>poll_after_sec</code> (every {} s before an answer carried one)",
                sc.poll_secs
            )
        }
    );

    let _ = write!(
        o,
        "<h2>People</h2><table><tr><th>joined</th><th>admitted</th><th>direct entries</th><th>completed</th><th>abandoned</th><th>expired</th><th>gone</th><th>failed</th><th>cut off at max_run_secs (still waiting)</th><th>resumed with place</th><th>resumed without</th></tr>\
         <tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} ({})</td><td>{}</td><td>{}</td></tr></table>",
        u.joined, u.admitted, u.direct_entries, u.completed, u.abandoned, u.expired, u.gone, u.failed, u.unfinished, u.still_waiting, u.resumed_kept, u.resumed_lost
    );
    if r.seats.is_some() {
        let _ = write!(
            o,
            "<p>With seats: {} entered and found no seat, {} were waiting when the sale ended, {} came after it (join refused).</p>",
            u.no_seats, u.sale_ended, u.closed
        );
    }
    let _ = write!(
        o,
        "<p>Order: {} people compared, {} certain FIFO inversions ({} at face value, with a {} s slack for live pushes), positions seen to grow {} times. \
         Capacity {}: the admin figures peaked at {} admitted + active, clients certainly held {} sessions at once. \
         Ghosts: {} went silent, {} removals seen ({} unseen). Idle slots: {} freed while people waited; the admin figures add up {:.1} slot-seconds free while places waited.</p>",
        r.order.compared,
        r.order.fifo_inversions,
        r.order.observed_inversions,
        r.order.slack_sec,
        r.order.position_rises,
        r.capacity.capacity,
        r.capacity.server_max_used,
        r.capacity.client_max_held,
        r.ghosts.silent,
        r.ghosts.removed,
        r.ghosts.unseen,
        r.idle_slots.frees,
        r.idle_slots.server_idle_slot_seconds
    );
    if !r.errors.is_empty() {
        o.push_str("<h2>Errors</h2><table><tr><th>what</th><th>count</th></tr>");
        for (what, n) in &r.errors {
            let _ = write!(o, "<tr><td>{}</td><td>{n}</td></tr>", esc(what));
        }
        o.push_str("</table>");
    }
    o.push_str("<p class=\"sub\">Written by <code>waitroom-bench journey</code>; the numbers are also in report.json.</p></body></html>\n");
    o
}

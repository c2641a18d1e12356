//! Seats in the flash crowd: the inventory the simulator puts up as the operator, the
//! seat-map choice each person makes, the end of the sale once nothing is left, and what
//! the report says about it: every seat sold once, the server's sold set equal to what
//! clients believe they bought, and how soon the people still waiting were told.
//!
//! The formulas are pure functions over what the clients and the admin reads recorded, so
//! each is tested on known answers apart from any server.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Result};
use serde::Serialize;
use serde_json::Value;

use super::metrics;
use super::user::{Log, Outcome, Transport};
use crate::common::{call_once, json_request, Conn, Target};

/// A request body is at most 64 KiB (`PAYLOAD_TOO_LARGE` past it); inventory chunks stay
/// under this, with room for the request's own framing.
pub const INVENTORY_BODY_MAX: usize = 60 * 1024;

/// Holds tried per person before giving up on a seat map that keeps changing under them.
pub const HOLD_TRIES: u32 = 5;

/// The hall: `n` seat ids, `S-00001` …, in id order (the inventory's own order).
pub fn seat_ids(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("S-{i:05}")).collect()
}

/// Splits `ids` into the fewest consecutive chunks whose body `{"items":[…]}` is at most
/// `max_body` bytes (ids are of `[A-Za-z0-9._:-]`, so none needs escaping). An id too
/// long for a chunk of its own still gets one (the server will say why it refuses it).
pub fn inventory_chunks(ids: &[String], max_body: usize) -> Vec<Vec<String>> {
    const FRAME: usize = r#"{"items":[]}"#.len();
    let mut chunks = Vec::new();
    let mut cur: Vec<String> = Vec::new();
    let mut size = FRAME;
    for id in ids {
        let add = id.len() + 2 + usize::from(!cur.is_empty());
        if !cur.is_empty() && size + add > max_body {
            chunks.push(std::mem::take(&mut cur));
            size = FRAME;
        }
        size += id.len() + 2 + usize::from(!cur.is_empty());
        cur.push(id.clone());
    }
    if !cur.is_empty() {
        chunks.push(cur);
    }
    chunks
}

/// `k` distinct seats drawn at random from `available` (all of them when fewer are left):
/// a partial Fisher–Yates shuffle, deterministic for the person's random state.
pub fn pick(available: &[String], k: usize, rng: &mut u64) -> Vec<String> {
    let n = available.len();
    let mut idx: Vec<usize> = (0..n).collect();
    let k = k.min(n);
    for i in 0..k {
        let j = i + (metrics::unit(rng) * (n - i) as f64) as usize;
        idx.swap(i, j.min(n - 1));
    }
    idx[..k].iter().map(|&i| available[i].clone()).collect()
}

/// Seats that two or more clients each believe they bought (goal: none), sorted.
pub fn double_sold(bought: &[&[String]]) -> Vec<String> {
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for set in bought {
        // A client counts each of its seats once, whatever its answers repeated.
        let mine: BTreeSet<&str> = set.iter().map(String::as_str).collect();
        for s in mine {
            *seen.entry(s).or_default() += 1;
        }
    }
    seen.into_iter()
        .filter(|&(_, n)| n > 1)
        .map(|(s, _)| s.to_string())
        .collect()
}

/// The server's sold set against the union of what clients believe they bought: seats
/// sold that no client knows it bought, and seats a client believes it bought that the
/// server did not sell. Both empty is the goal; their total is `seats_sold_mismatch`.
pub fn sold_mismatch(sold: &[String], bought: &[&[String]]) -> (Vec<String>, Vec<String>) {
    let sold: BTreeSet<&str> = sold.iter().map(String::as_str).collect();
    let union: BTreeSet<&str> = bought
        .iter()
        .flat_map(|b| b.iter().map(String::as_str))
        .collect();
    let owned = |v: std::collections::btree_set::Difference<'_, &str>| -> Vec<String> {
        v.map(|s| s.to_string()).collect()
    };
    (
        owned(sold.difference(&union)),
        owned(union.difference(&sold)),
    )
}

/// How long people still waiting took to learn that the sale ended: each `learned`
/// instant minus the end call's `end_at`, or minus the person's return if they were
/// offline (a reload, an outage: `offline` = [from, to)) when the call was made: nobody
/// can be told while their page is gone. Never negative (an answer a person had asked
/// for just before the call may arrive just after it).
pub fn notice_delays(end_at: f64, told: &[(f64, Option<(f64, f64)>)]) -> Vec<f64> {
    told.iter()
        .map(|&(learned, offline)| {
            let from = match offline {
                Some((a, b)) if a <= end_at && end_at < b => b,
                _ => end_at,
            };
            (learned - from).max(0.0)
        })
        .collect()
}

/// The inventory's counts in an admin answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub total: u64,
    pub available: u64,
    pub held: u64,
    pub sold: u64,
}

impl Counts {
    pub fn of(v: &Value) -> Counts {
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        Counts {
            total: n("total"),
            available: n("available"),
            held: n("held"),
            sold: n("sold"),
        }
    }

    /// Nothing is left to hold or to buy: the moment the operator ends the sale.
    pub fn sold_out(&self) -> bool {
        self.total > 0 && self.available == 0 && self.held == 0
    }
}

/// The ids of the sold items of `GET /admin/events/{id}/inventory`.
pub fn sold_ids(inventory: &Value) -> Vec<String> {
    inventory["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|i| i["state"] == "sold")
                .filter_map(|i| i["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Puts the hall up, in chunks under the body limit (the call is safe to repeat).
pub async fn put_inventory(target: &Target, admin: &str, event: &str, n: usize) -> Result<()> {
    for chunk in inventory_chunks(&seat_ids(n), INVENTORY_BODY_MAX) {
        let body = serde_json::json!({ "items": chunk }).to_string();
        let mut req = Vec::with_capacity(body.len() + 256);
        let path = format!("/api/v1/admin/events/{event}/inventory");
        json_request("PUT", &target.host, &path, Some(admin), &body, &mut req);
        let (status, answer) = call_once(target, &req).await?;
        if status != 200 {
            bail!("putting the inventory of {event}: {status} {answer}");
        }
    }
    Ok(())
}

/// `GET /admin/events/{id}/inventory` on the operator's keep-alive connection.
pub async fn read_inventory(
    target: &Target,
    admin: &str,
    event: &str,
    conn: &mut Option<Conn>,
) -> Option<Value> {
    let path = format!("/api/v1/admin/events/{event}/inventory");
    super::admin_get(target, admin, &path, conn).await
}

/// `POST /admin/events/{id}/end` with `sold_out`: answers the places waiting just before.
pub async fn end_sold_out(target: &Target, admin: &str, event: &str) -> Result<u64> {
    let body = serde_json::json!({
        "reason": "sold_out",
        "message": {"en": "Sold out", "ko": "매진되었습니다"},
    })
    .to_string();
    let mut req = Vec::new();
    let path = format!("/api/v1/admin/events/{event}/end");
    json_request("POST", &target.host, &path, Some(admin), &body, &mut req);
    let (status, answer) = call_once(target, &req).await?;
    if status != 200 {
        bail!("ending {event}: {status} {answer}");
    }
    let v: Value = serde_json::from_str(&answer).unwrap_or(Value::Null);
    Ok(v["waiting"].as_u64().unwrap_or(0))
}

/// The operator's end of the sale, as the sampling loop made it.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SoldOutCall {
    /// When the call was sent (seconds since the opening): the notices count from here.
    pub sent_sec: f64,
    pub answered_sec: f64,
    /// Places waiting just before the end, by the end call's answer.
    pub waiting: u64,
}

/// One reading of the inventory's counts.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct InvSample {
    pub t: f64,
    #[serde(flatten)]
    pub counts: Counts,
}

/// The headline numbers of a run with seats (top level of report.json).
#[derive(Debug, Default, Serialize)]
pub struct Headline {
    pub seats_sold: u64,
    pub seats_bought_by_clients: u64,
    pub seats_double_sold: u64,
    pub seats_sold_mismatch: u64,
    pub hold_conflicts: u64,
    pub people_without_seats: u64,
    pub sold_out_at_sec: Option<f64>,
    pub sold_out_notice_p50_sec: Option<f64>,
    pub sold_out_notice_p99_sec: Option<f64>,
}

/// How the people still waiting were told, for one transport or all.
#[derive(Debug, Default, Serialize)]
pub struct Notices {
    pub told: usize,
    pub p50_sec: Option<f64>,
    pub p99_sec: Option<f64>,
    pub max_sec: Option<f64>,
}

#[derive(Debug, Default, Serialize)]
pub struct Seats {
    pub seats: u64,
    pub seats_per_person: [u32; 2],
    /// The server's inventory at the end of the run.
    pub end_counts: Counts,
    /// People who bought at least one seat, and the seats they bought (a client's own
    /// count: the holds its last hold answer listed when its `complete` succeeded).
    pub buyers: usize,
    pub bought: u64,
    /// Buyers who found fewer seats than they wanted and took what was left.
    pub buyers_short: usize,
    pub double_sold: Vec<String>,
    /// Sold seats no client knows it bought, seats a client believes it bought unsold
    /// (at most 20 of each listed; the counts are whole).
    pub sold_not_bought: usize,
    pub bought_not_sold: usize,
    pub mismatch_examples: Vec<String>,
    pub hold_attempts: u64,
    pub hold_conflicts: u64,
    /// People who entered and left without a seat (none left, or every try conflicted).
    pub people_without_seats: usize,
    pub gave_up_on_conflicts: usize,
    pub end_when_sold_out: bool,
    pub sold_out: Option<SoldOutCall>,
    /// People waiting when the sale ended, told by a live `ended` push or a status answer;
    /// and those never told (goal 0).
    pub notices: Notices,
    pub notices_by_transport: BTreeMap<Transport, Notices>,
    pub told_by_push: usize,
    pub told_by_status: usize,
    pub untold: usize,
    /// Joins refused with `EVENT_CLOSED` after the end (people who came too late).
    pub closed_at_join: usize,
    /// The inventory each second (the last reading within it).
    pub series: Vec<InvSample>,
}

fn notices(v: &[f64]) -> Notices {
    let mut v = v.to_vec();
    Notices {
        told: v.len(),
        p50_sec: metrics::percentile(&mut v, 0.5),
        p99_sec: metrics::percentile(&mut v, 0.99),
        max_sec: metrics::percentile(&mut v, 1.0),
    }
}

/// The seats section and the headline numbers, from the clients' logs, the operator's
/// inventory readings, the final inventory and the end call.
pub fn section(
    sc: &super::Scenario,
    logs: &[Log],
    final_inventory: &Value,
    inv_samples: &[InvSample],
    sold_out: Option<SoldOutCall>,
) -> (Headline, Seats) {
    let bought: Vec<&[String]> = logs
        .iter()
        .filter(|l| !l.seats_bought.is_empty())
        .map(|l| l.seats_bought.as_slice())
        .collect();
    let sold = sold_ids(final_inventory);
    let double = double_sold(&bought);
    let (sold_not_bought, bought_not_sold) = sold_mismatch(&sold, &bought);
    let mut mismatch_examples: Vec<String> = sold_not_bought
        .iter()
        .take(20)
        .map(|s| format!("sold, not bought: {s}"))
        .collect();
    mismatch_examples.extend(
        bought_not_sold
            .iter()
            .take(20)
            .map(|s| format!("bought, not sold: {s}")),
    );
    let mut told: Vec<(Transport, f64)> = Vec::new();
    let (mut by_push, mut by_status, mut untold) = (0, 0, 0);
    if let Some(call) = sold_out {
        for l in logs {
            match (&l.outcome, l.ended_learned) {
                (Outcome::SaleEnded, Some(learned)) => {
                    let d = notice_delays(call.sent_sec, &[(learned, l.offline)])[0];
                    told.push((l.plan.transport, d));
                    if l.ended_by_push {
                        by_push += 1;
                    } else {
                        by_status += 1;
                    }
                }
                // Joined, never admitted, not a ghost, and not told: the end passed them by.
                _ if l.join_ack.is_some()
                    && l.admit_hi.is_none()
                    && l.silent_at.is_none()
                    && l.join_ack < Some(call.sent_sec) =>
                {
                    untold += 1
                }
                _ => {}
            }
        }
    }
    let all: Vec<f64> = told.iter().map(|t| t.1).collect();
    let mut by_transport = BTreeMap::new();
    for t in [Transport::Ws, Transport::Poll] {
        let v: Vec<f64> = told.iter().filter(|x| x.0 == t).map(|x| x.1).collect();
        if !v.is_empty() {
            by_transport.insert(t, notices(&v));
        }
    }
    let mut series: Vec<InvSample> = Vec::new();
    for s in inv_samples {
        match series.last_mut() {
            Some(last) if last.t.floor() == s.t.floor() => *last = *s,
            _ => series.push(*s),
        }
    }
    let entered: Vec<&Log> = logs.iter().filter(|l| l.entered.is_some()).collect();
    let seats = Seats {
        seats: sc.seats as u64,
        seats_per_person: sc.seats_per_person,
        end_counts: Counts::of(final_inventory),
        buyers: bought.len(),
        bought: bought.iter().map(|b| b.len() as u64).sum(),
        buyers_short: logs
            .iter()
            .filter(|l| {
                !l.seats_bought.is_empty() && l.seats_bought.len() < l.plan.seats_wanted as usize
            })
            .count(),
        double_sold: double,
        sold_not_bought: sold_not_bought.len(),
        bought_not_sold: bought_not_sold.len(),
        mismatch_examples,
        hold_attempts: entered.iter().map(|l| u64::from(l.hold_attempts)).sum(),
        hold_conflicts: entered.iter().map(|l| u64::from(l.hold_conflicts)).sum(),
        people_without_seats: logs
            .iter()
            .filter(|l| l.outcome == Outcome::NoSeats)
            .count(),
        gave_up_on_conflicts: logs
            .iter()
            .filter(|l| l.outcome == Outcome::NoSeats && l.hold_conflicts >= HOLD_TRIES)
            .count(),
        end_when_sold_out: sc.end_when_sold_out,
        sold_out,
        notices: notices(&all),
        notices_by_transport: by_transport,
        told_by_push: by_push,
        told_by_status: by_status,
        untold,
        closed_at_join: logs.iter().filter(|l| l.outcome == Outcome::Closed).count(),
        series,
    };
    let headline = Headline {
        seats_sold: seats.end_counts.sold,
        seats_bought_by_clients: seats.bought,
        seats_double_sold: seats.double_sold.len() as u64,
        seats_sold_mismatch: (seats.sold_not_bought + seats.bought_not_sold) as u64,
        hold_conflicts: seats.hold_conflicts,
        people_without_seats: seats.people_without_seats as u64,
        sold_out_at_sec: sold_out.map(|c| c.sent_sec),
        sold_out_notice_p50_sec: seats.notices.p50_sec,
        sold_out_notice_p99_sec: seats.notices.p99_sec,
    };
    (headline, seats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn inventory_chunks_fit_the_body_limit_and_keep_every_id_in_order() {
        let all = seat_ids(20_000);
        assert_eq!(all[0], "S-00001");
        assert_eq!(all[19_999], "S-20000");
        let chunks = inventory_chunks(&all, INVENTORY_BODY_MAX);
        // 7-character ids cost 10 bytes each: about 6,100 per 60 KiB body.
        assert_eq!(chunks.len(), 4);
        for c in &chunks {
            let body = serde_json::json!({ "items": c }).to_string();
            assert!(body.len() <= INVENTORY_BODY_MAX, "{}", body.len());
        }
        let again: Vec<String> = chunks.concat();
        assert_eq!(again, all);
        // Exactly at the limit: {"items":["ab","cd"]} is 21 bytes.
        let two = ids(&["ab", "cd", "ef"]);
        assert_eq!(
            inventory_chunks(&two, 21),
            vec![ids(&["ab", "cd"]), ids(&["ef"])]
        );
        assert_eq!(inventory_chunks(&two, 20).len(), 3);
        assert!(inventory_chunks(&[], 100).is_empty());
    }

    #[test]
    fn a_pick_is_k_distinct_available_seats_or_all_that_are_left() {
        let avail = seat_ids(10);
        let mut rng = 42;
        let p = pick(&avail, 4, &mut rng);
        assert_eq!(p.len(), 4);
        let distinct: BTreeSet<&String> = p.iter().collect();
        assert_eq!(distinct.len(), 4);
        assert!(p.iter().all(|s| avail.contains(s)));
        // Deterministic for a state, different for another.
        assert_eq!(pick(&avail, 4, &mut 42), p);
        assert_ne!(pick(&avail, 4, &mut 43), p);
        // Fewer left than wanted: all of them.
        let two = ids(&["A", "B"]);
        let mut got = pick(&two, 4, &mut rng);
        got.sort();
        assert_eq!(got, two);
        assert!(pick(&[], 3, &mut rng).is_empty());
        // Every seat is drawn sometimes (not always the first ones).
        let mut seen = BTreeSet::new();
        for _ in 0..200 {
            seen.extend(pick(&avail, 1, &mut rng));
        }
        assert_eq!(seen.len(), 10);
    }

    #[test]
    fn double_sold_seats_are_those_two_clients_claim() {
        let a = ids(&["A-1", "A-2"]);
        let b = ids(&["A-3"]);
        let c = ids(&["A-2", "A-3", "A-3"]);
        assert!(double_sold(&[&a, &b]).is_empty());
        assert_eq!(double_sold(&[&a, &b, &c]), ids(&["A-2", "A-3"]));
        // One client repeating a seat is not a double sale.
        let d = ids(&["B-1", "B-1"]);
        assert!(double_sold(&[&d]).is_empty());
    }

    #[test]
    fn the_sold_set_is_compared_both_ways_with_what_clients_bought() {
        let a = ids(&["A-1", "A-2"]);
        let b = ids(&["A-3"]);
        let sold = ids(&["A-3", "A-2", "A-1"]);
        assert_eq!(sold_mismatch(&sold, &[&a, &b]), (vec![], vec![]));
        let sold = ids(&["A-1", "A-3", "A-4"]);
        assert_eq!(
            sold_mismatch(&sold, &[&a, &b]),
            (ids(&["A-4"]), ids(&["A-2"]))
        );
        assert_eq!(sold_mismatch(&[], &[]), (vec![], vec![]));
    }

    #[test]
    fn notices_count_from_the_call_or_from_a_return_online() {
        let told = [
            (10.5, None),              // told half a second after the call
            (12.0, Some((2.0, 4.0))),  // offline before the call only: from the call
            (15.0, Some((9.0, 14.0))), // offline at the call: from the return at 14
            (9.9, None),               // an answer asked for before the call
        ];
        assert_eq!(notice_delays(10.0, &told), vec![0.5, 2.0, 1.0, 0.0]);
    }

    #[test]
    fn sold_out_is_nothing_available_nor_held() {
        let c = |available, held| Counts {
            total: 10,
            available,
            held,
            sold: 10 - available - held,
        };
        assert!(c(0, 0).sold_out());
        assert!(!c(1, 0).sold_out());
        assert!(!c(0, 2).sold_out());
        assert!(
            !Counts::default().sold_out(),
            "no inventory is not a sell-out"
        );
        let v = serde_json::json!({"total": 3, "available": 1, "held": 1, "sold": 1,
            "items": [{"id": "A-1", "state": "sold", "place": 1},
                      {"id": "A-2", "state": "held", "place": 4},
                      {"id": "A-3", "state": "available"}]});
        assert_eq!(
            Counts::of(&v),
            Counts {
                total: 3,
                available: 1,
                held: 1,
                sold: 1
            }
        );
        assert_eq!(sold_ids(&v), ids(&["A-1"]));
    }
}

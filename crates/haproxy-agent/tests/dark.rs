//! The agent never goes dark without saying so: HAProxy killed in the middle of a reload is back
//! within about a second and `/healthz` answers 503 meanwhile; an agent that lost its state while
//! HAProxy kept serving leaves HAProxy as it is, says it is not caught up (to keepalived through
//! `/healthz`, to vipwatch through the identity headers of every answer) until vipwatch's full
//! resync went live; a HAProxy process that is alive but does not answer is reported, too.

mod common;

use std::time::Duration;

use common::*;
use tokio::time::Instant;
use vipwatch_contract::ReceiverIdentity;

/// How long HAProxy may stay gone after its master was killed: the supervisor looks every 100 ms and
/// starts it at once.
const BACK_WITHIN: Duration = Duration::from_millis(1500);

/// The master's environment as its last `exec` set it: it re-executes itself on every reload, with
/// a new `HAPROXY_PROCESSES`, so a change means it received the reload.
fn environ(pid: u32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default()
}

/// Whether process `pid` has exited (reaped, or a zombie).
fn exited(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return true };
    matches!(stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()), Some("Z" | "X"))
}

fn master_pid(agent: &Agent) -> u32 {
    std::fs::read_to_string(agent.dir.path().join("haproxy.pid")).unwrap().trim().parse().unwrap()
}

/// GET `path` with its receiver identity headers.
async fn get_with_identity(agent: &Agent, path: &str) -> (u16, String, Option<ReceiverIdentity>) {
    let r = agent.client.get(format!("{}{path}", agent.url)).send().await.unwrap();
    let id = identity(r.headers());
    (r.status().as_u16(), r.text().await.unwrap(), id)
}

/// POSTs a delivery signed with the right secret; the status, the body and the identity headers.
async fn send_with_identity(
    agent: &Agent,
    payload: &vipwatch_contract::WebhookPayload,
) -> (u16, serde_json::Value, Option<ReceiverIdentity>) {
    let body = serde_json::to_string(payload).unwrap();
    let id = fresh_id();
    let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let signature = standardwebhooks::Webhook::new(SECRET).unwrap().sign(&id, ts, body.as_bytes()).unwrap();
    let r = agent
        .client
        .post(format!("{}/hooks/vip", agent.url))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await
        .unwrap();
    let identity = identity(r.headers());
    (r.status().as_u16(), r.json().await.unwrap_or(serde_json::Value::Null), identity)
}

#[tokio::test]
async fn haproxy_killed_mid_reload_is_back_within_a_second_and_healthz_is_503_meanwhile() {
    let Some(agent) = Agent::start().await else { return };
    assert_eq!(resync(&agent, "sync_1", &[]).await, [200]);
    let (a, b) = (pod("a").await, pod("b").await);
    let (v1, v2) = (vip(), vip());
    assert_eq!(agent.send(&delivery("service.added", 1, "one", &v1, &[18091], &[active(0, a)])).await.0, 200);
    assert_eq!(agent.get("/healthz").await, (200, "ok".to_owned()));

    // A Service with a new VIP needs a reload; the master is SIGKILLed as soon as it has re-executed
    // itself for it (its workers exit with it).
    let pid = master_pid(&agent);
    let before = environ(pid);
    let added = delivery("service.added", 2, "two", &v2, &[18091], &[active(0, b)]);
    let delivering = agent.send(&added);
    let killing = async {
        let deadline = Instant::now() + DEADLINE;
        while environ(pid) == before {
            assert!(Instant::now() < deadline, "the master never received the reload");
            tokio::time::sleep(Duration::from_millis(1)).await; // ok: polling under a deadline
        }
        assert!(std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
        let killed = Instant::now();
        while !exited(pid) {
            assert!(killed.elapsed() < DEADLINE, "the master outlived SIGKILL");
            tokio::time::sleep(Duration::from_millis(1)).await; // ok: polling under a deadline
        }
        // Every /healthz answer from the kill on, until it is 200 again.
        let mut answers = Vec::new();
        loop {
            let (status, text) = agent.get("/healthz").await;
            answers.push((status, text));
            if status == 200 {
                break;
            }
            assert!(killed.elapsed() < DEADLINE, "HAProxy never came back: {answers:?}");
            tokio::time::sleep(Duration::from_millis(5)).await; // ok: polling under a deadline
        }
        (killed.elapsed(), answers)
    };
    let ((status, body), (back, answers)) = tokio::join!(delivering, killing);
    eprintln!(
        "HAProxy killed mid-reload: /healthz 200 again after {back:?}, {} answers of 503 before",
        answers.len() - 1
    );
    assert_ne!(master_pid(&agent), pid, "a new master runs");
    assert!(back < BACK_WITHIN, "back after {back:?}");
    let (first, text) = &answers[0];
    assert_eq!(*first, 503, "the first /healthz after the kill: {text}");
    assert!(text.starts_with("not healthy: ") && text.contains(&format!("pid {pid}")), "it says why: {text}");
    // The new master started from the file the reload had put in place: the delivery is live.
    assert_eq!((status, body["status"].as_str()), (200, Some("applied")), "{body}");
    assert_eq!(hit(&format!("{v1}:18091")).await.as_deref(), Ok("a"));
    assert_eq!(hit(&format!("{v2}:18091")).await.as_deref(), Ok("b"));
    let (_, metrics) = agent.get("/metrics").await;
    assert!(metrics.lines().any(|l| l == "vipwatch_haproxy_restarts_total 1"), "{metrics}");
    agent.stop().await;
}

/// An agent after its first resync, serving Service `one` on a new VIP and `port` with Pod `a`; the
/// VIP and the Pod's address. `None` without HAProxy.
async fn serving_one(port: i32) -> Option<(Agent, String, std::net::SocketAddr)> {
    let agent = Agent::start().await?;
    assert_eq!(resync(&agent, "sync_1", &[]).await, [200]);
    let (a, v1) = (pod("a").await, vip());
    assert_eq!(agent.send(&delivery("service.added", 1, "one", &v1, &[port], &[active(0, a)])).await.0, 200);
    Some((agent, v1, a))
}

/// Sends `signal` (`-STOP`, `-CONT`) to process `pid`.
fn signal(pid: u32, signal: &str) {
    assert!(std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap().success());
}

/// Waits until `/healthz` answers `status`; its text.
async fn healthz_until(agent: &Agent, status: u16) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (s, text) = agent.get("/healthz").await;
        if s == status {
            return text;
        }
        assert!(Instant::now() < deadline, "/healthz never answered {status}: {s} {text}");
        tokio::time::sleep(Duration::from_millis(20)).await; // ok: polling under a deadline
    }
}

/// A worker that is alive but stopped keeps its listening sockets and serves nothing, while its
/// master answers as usual: `/healthz` says so (keepalived then moves the VIPs) until it resumes;
/// so does a stopped master.
#[tokio::test]
async fn a_stopped_worker_or_master_makes_healthz_503_until_it_answers_again() {
    let Some((agent, v1, _)) = serving_one(18093).await else { return };
    assert_eq!(agent.get("/healthz").await, (200, "ok".to_owned()));
    let master = master_pid(&agent);
    let children = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children")).unwrap();
    let worker: u32 = children.split_whitespace().next().expect("a worker").parse().unwrap();

    signal(worker, "-STOP");
    let stopped = Instant::now();
    let text = healthz_until(&agent, 503).await;
    eprintln!("worker stopped: /healthz 503 after {:?}", stopped.elapsed());
    let expected = format!(
        "HAProxy is not answering: its worker {worker} does not answer: no answer to `show info` in 400ms (master pid {master})"
    );
    assert_eq!(text, format!("not healthy: {expected}"));
    // A reload makes the stopped worker an old one, which keeps its listening sockets: still 503.
    let (b, v2) = (pod("b").await, vip());
    let added = agent.send(&delivery("service.added", 2, "two", &v2, &[18093], &[active(0, b)])).await;
    assert_eq!(added.0, 200, "{:?}", added.1);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (status, text) = agent.get("/healthz").await;
        assert_eq!(status, 503, "{text}");
        if text.contains(&format!("its worker {worker} does not answer")) {
            break;
        }
        assert!(Instant::now() < deadline, "the old stopped worker is never named: {text}");
        tokio::time::sleep(Duration::from_millis(20)).await; // ok: polling under a deadline
    }
    signal(worker, "-CONT");
    assert_eq!(healthz_until(&agent, 200).await, "ok");
    assert_eq!(hit(&format!("{v1}:18093")).await.as_deref(), Ok("a"));

    signal(master, "-STOP");
    let text = healthz_until(&agent, 503).await;
    assert!(text.starts_with("not healthy: ") && text.contains("its master CLI does not answer"), "{text}");
    signal(master, "-CONT");
    assert_eq!(healthz_until(&agent, 200).await, "ok");
    let (_, metrics) = agent.get("/metrics").await;
    assert!(metrics.lines().any(|l| l == "vipwatch_haproxy_restarts_total 0"), "neither was restarted: {metrics}");
    agent.stop().await;
}

/// A directory wiped while HAProxy ran (its state, configuration, pid file and control sockets
/// gone): the agent cannot reach that HAProxy, which still serves what it ran and holds the VIPs'
/// ports, so it refuses to start rather than start a second HAProxy beside it, naming the pids;
/// once they are stopped it starts as usual.
#[tokio::test]
async fn an_agent_whose_directory_was_wiped_while_haproxy_ran_names_that_haproxy_and_starts_no_second() {
    let Some((mut agent, v1, _)) = serving_one(18094).await else { return };
    let master = master_pid(&agent);
    agent.running.take().unwrap().stop().await;
    for entry in std::fs::read_dir(agent.dir.path()).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = agent.config();
    config.stop_haproxy_on_exit = false;
    let refused = vipwatch_haproxy::start(config, listener).await.err().expect("the agent refuses to start");
    let children = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children")).unwrap();
    let mut pids: Vec<u32> =
        std::iter::once(master).chain(children.split_whitespace().map(|p| p.parse().unwrap())).collect();
    pids.sort_unstable();
    let list = pids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    let socket = agent.dir.path().join("master.sock");
    assert!(
        refused.to_string().contains(&format!(
            "HAProxy of this directory runs (pids {list}) but its master socket {} is gone",
            socket.display()
        )),
        "{refused}"
    );
    assert_eq!(hit(&format!("{v1}:18094")).await.as_deref(), Ok("a"), "the old HAProxy still serves");

    signal(master, "-TERM");
    let deadline = Instant::now() + DEADLINE;
    while !exited(master) {
        assert!(Instant::now() < deadline, "HAProxy outlived SIGTERM");
        tokio::time::sleep(Duration::from_millis(10)).await; // ok: polling under a deadline
    }
    agent.restart().await;
    assert_ne!(master_pid(&agent), master, "the agent's own HAProxy");
    agent.stop().await;
}

#[tokio::test]
async fn an_agent_that_lost_its_state_holds_the_serving_haproxy_until_a_resync_went_live() {
    let Some(mut agent) = Agent::start().await else { return };
    assert_eq!(resync(&agent, "sync_1", &[]).await, [200]);
    let (a, b) = (pod("a").await, pod("b").await);
    let (v1, v2) = (vip(), vip());
    let (status, _, id) =
        send_with_identity(&agent, &delivery("service.added", 1, "one", &v1, &[18092], &[active(0, a)])).await;
    assert_eq!(status, 200);
    let old = id.expect("identity headers");
    assert_eq!((old.caught_up, old.concurrency), (Some(true), Some(4096)));
    assert_eq!(agent.send(&delivery("service.added", 2, "two", &v2, &[18092], &[active(0, b)])).await.0, 200);
    let reloads = agent.reloads().await;

    // The agent stops (HAProxy keeps serving) and its state is lost with the configuration file.
    agent.running.take().unwrap().stop().await;
    std::fs::remove_file(agent.dir.path().join("state.json")).unwrap();
    std::fs::remove_file(agent.dir.path().join("haproxy.cfg")).unwrap();
    agent.restart().await;

    // No reload with an empty configuration: HAProxy serves both Services as before.
    assert_eq!(agent.reloads().await, reloads);
    assert_eq!(hit(&format!("{v1}:18092")).await.as_deref(), Ok("a"));
    assert_eq!(hit(&format!("{v2}:18092")).await.as_deref(), Ok("b"));
    let held = "not caught up: waiting for the first full resync (this run has none yet, and its state names no \
                cluster to wait for); HAProxy keeps the configuration it runs (the agent's state was lost) until then";
    let (status, text, id) = get_with_identity(&agent, "/healthz").await;
    assert_eq!(id.as_ref().and_then(|i| i.concurrency), Some(4096), "every answer says how many it takes at once");
    assert_eq!((status, text.as_str()), (503, held));
    let new = id.expect("identity headers on /healthz");
    assert_ne!(new.generation, old.generation, "a new state identity");
    assert_ne!(new.instance, old.instance, "a new run");
    assert_eq!(new.caught_up, None, "/healthz is about no cluster");

    // A probe (GET on the delivery URL) says the same, for the sender's cluster.
    let (status, text, id) = get_with_identity(&agent, "/hooks/vip").await;
    assert_eq!(status, 200);
    assert_eq!(id.as_ref().map(|i| (i.generation.as_str(), i.caught_up)), Some((new.generation.as_str(), Some(false))));
    let probe: vipwatch_contract::ReceiverState = serde_json::from_str(&text).unwrap();
    assert_eq!(
        probe,
        vipwatch_contract::ReceiverState {
            generation: new.generation.clone(),
            instance: new.instance.clone(),
            cluster: "default".into(),
            cluster_caught_up: false,
            caught_up: false,
            waiting_for: vec![],
            clusters: Default::default(),
        }
    );

    // A delivery meanwhile is recorded, answered 202 `held`, and changes nothing in HAProxy.
    let moved = delivery("service.modified", 3, "one", &v1, &[18092], &[active(0, a), active(0, b)]);
    let (status, body, id) = send_with_identity(&agent, &moved).await;
    assert_eq!((status, body["status"].as_str(), body["reason"].as_str()), (202, Some("held"), Some(held)), "{body}");
    assert_eq!(id.map(|i| (i.generation, i.caught_up)), Some((new.generation.clone(), Some(false))));
    assert_eq!(agent.reloads().await, reloads);
    assert_eq!(hit(&format!("{v1}:18092")).await.as_deref(), Ok("a"));
    let (_, state) = agent.get("/state").await;
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    assert_eq!((state["holding"].as_bool(), state["caughtUp"].as_bool()), (Some(true), Some(false)), "{state}");

    // vipwatch's full resync (only `one` now) goes live in one reload and replaces what HAProxy ran.
    // The Service that completes it (the last of its `total` to arrive) is answered once it is live.
    let v3 = vip();
    let one = delivery("service.synced", 4, "one", &v1, &[18092], &[active(0, b)]);
    let three = delivery("service.synced", 4, "three", &v3, &[18092], &[active(0, a)]);
    assert_eq!(resync(&agent, "sync_2", &[one, three]).await, [202, 200, 200]);
    assert_eq!(agent.reloads().await, reloads + 1);
    assert_eq!(get_with_identity(&agent, "/healthz").await.0, 200);
    assert_eq!(hit(&format!("{v1}:18092")).await.as_deref(), Ok("b"));
    assert_eq!(hit(&format!("{v3}:18092")).await.as_deref(), Ok("a"));
    assert!(hit(&format!("{v2}:18092")).await.is_err(), "the Service the resync left out is gone");
    let (_, _, id) = get_with_identity(&agent, "/hooks/vip").await;
    assert_eq!(id.map(|i| (i.generation, i.caught_up)), Some((new.generation.clone(), Some(true))));

    // The identity is the state's: a restart keeps it (and, having missed nothing it knows of, the
    // agent waits for a resync of the cluster it has).
    agent.restart().await;
    let (status, text, id) = get_with_identity(&agent, "/healthz").await;
    assert_eq!((status, text.as_str()), (503, "not caught up: waiting for a full resync of cluster default"));
    let id = id.unwrap();
    assert_eq!(id.generation, new.generation);
    assert_ne!(id.instance, new.instance);
    assert_eq!(agent.reloads().await, reloads + 1, "the state renders what HAProxy runs: no reload");
    agent.stop().await;
}

#[tokio::test]
async fn a_lost_state_json_with_the_haproxy_cfg_left_holds_haproxy_running_or_not() {
    let Some((mut agent, v1, a)) = serving_one(18093).await else { return };
    let (text, reloads) = (agent.config_text(), agent.reloads().await);
    let held = "not caught up: waiting for the first full resync (this run has none yet, and its state names no \
                cluster to wait for); HAProxy keeps the configuration it runs (the agent's state was lost) until then";

    // state.json lost, HAProxy running, haproxy.cfg left: attached as it is.
    agent.running.take().unwrap().stop().await;
    std::fs::remove_file(agent.dir.path().join("state.json")).unwrap();
    agent.restart().await;
    assert_eq!(agent.reloads().await, reloads);
    assert_eq!(agent.config_text(), text, "the file HAProxy runs is kept");
    assert_eq!(agent.get("/healthz").await, (503, held.to_owned()));
    assert_eq!(hit(&format!("{v1}:18093")).await.as_deref(), Ok("a"));

    // state.json lost again, HAProxy stopped too, haproxy.cfg left: HAProxy starts from that file.
    agent.running.take().unwrap().stop().await;
    let pid = master_pid(&agent);
    vipwatch_haproxy::haproxy::Haproxy::new("haproxy".as_ref(), agent.dir.path()).stop().await;
    wait_until("HAProxy stopped", || async { exited(pid) }).await;
    assert!(hit(&format!("{v1}:18093")).await.is_err());
    std::fs::remove_file(agent.dir.path().join("state.json")).unwrap();
    agent.restart().await;
    assert_ne!(master_pid(&agent), pid);
    assert_eq!(agent.config_text(), text);
    assert_eq!(agent.get("/healthz").await, (503, held.to_owned()));
    assert_eq!(hit(&format!("{v1}:18093")).await.as_deref(), Ok("a"), "served from the file left");

    // The resync goes live and the agent is caught up.
    let one = delivery("service.synced", 2, "one", &v1, &[18093], &[active(0, a)]);
    assert_eq!(resync(&agent, "sync_2", &[one]).await, [200, 200]);
    assert_eq!(agent.get("/healthz").await, (200, "ok".to_owned()));
    assert_eq!(hit(&format!("{v1}:18093")).await.as_deref(), Ok("a"));
    agent.stop().await;
}

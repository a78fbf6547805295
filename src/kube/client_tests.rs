use super::*;
use std::io::Read;
use std::ops::ControlFlow;

use crate::kube::verbs::page_through;
use serde_json::json;

fn api(status: u16, retry_after: Option<u64>) -> Error {
    Error::Api {
        status,
        body: Status::default(),
        retry_after: retry_after.map(Duration::from_secs),
    }
}

/// A `Retry-After: 600` the client caps at 10 s is counted as the 10 s it
/// waits, not the 600 s it was asked for.
#[test]
fn a_capped_retry_after_counts_the_wait_taken() {
    let mut b = Backoff::new(RETRY_BASE, RETRY_CAP, Jitter::seeded(1));
    let before = crate::metrics::tests::retry_after_seconds();
    let wait = retry_delay(&Method::GET, &api(429, Some(600)), 1, &mut b);
    assert_eq!(wait, Some(RETRY_CAP));
    let counted = crate::metrics::tests::retry_after_seconds() - before;
    assert!(
        (counted - RETRY_CAP.as_secs_f64()).abs() < 1e-6,
        "counted {counted} s for a wait of {RETRY_CAP:?}"
    );
}

#[test]
fn retry_policy() {
    let mut b = Backoff::new(RETRY_BASE, RETRY_CAP, Jitter::seeded(1));
    assert_eq!(
        retry_delay(&Method::POST, &api(429, Some(2)), 1, &mut b),
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        retry_delay(&Method::GET, &api(429, Some(600)), 1, &mut b),
        Some(RETRY_CAP),
        "Retry-After is capped"
    );
    // Every 429 advanced the backoff: this is its third step.
    assert!(
        retry_delay(&Method::GET, &api(503, None), 1, &mut b).is_some_and(|d| d <= RETRY_BASE * 4)
    );
    let mut fresh = Backoff::new(RETRY_BASE, RETRY_CAP, Jitter::seeded(1));
    assert!(
        retry_delay(&Method::GET, &api(429, Some(0)), 1, &mut fresh)
            .is_some_and(|d| d >= Duration::from_secs(1)),
        "Retry-After: 0 never retries faster than once a second"
    );
    assert!(retry_delay(&Method::PATCH, &api(500, None), 2, &mut b).is_some());
    assert_eq!(
        retry_delay(&Method::POST, &api(500, None), 1, &mut b),
        None,
        "a create is not repeated blindly"
    );
    assert_eq!(retry_delay(&Method::PUT, &api(409, None), 1, &mut b), None);
    assert_eq!(retry_delay(&Method::GET, &api(403, None), 1, &mut b), None);
    assert_eq!(
        retry_delay(&Method::GET, &api(503, None), RETRIES + 1, &mut b),
        None,
        "bounded"
    );
}

#[test]
fn paging_follows_tokens_asks_smaller_pages_and_restarts_once_on_410() {
    let page = |items: &[i64], next: Option<&str>| {
        Ok((
            items.iter().map(|i| json!(i)).collect(),
            next.map(str::to_owned),
        ))
    };
    // Pages 1, 2 (410 the first time), then a full restart.
    let mut calls = Vec::new();
    let mut gone_once = false;
    let mut seen = Vec::new();
    let r = page_through(
        500,
        |token, _| {
            calls.push(token.map(str::to_owned));
            match token {
                None => page(&[1, 2], Some("t1")),
                Some("t1") if !gone_once => {
                    gone_once = true;
                    Err(api(410, None))
                }
                Some("t1") => page(&[3], None),
                _ => unreachable!(),
            }
        },
        |v| {
            seen.push(v.as_i64().unwrap());
            ControlFlow::Continue(())
        },
    );
    assert!(r.is_ok());
    assert_eq!(calls, [None, Some("t1".into()), None, Some("t1".into())]);
    assert_eq!(seen, [1, 2, 1, 2, 3]);
    // A second 410 is an error.
    let r = page_through(
        500,
        |t, _| {
            if t.is_none() {
                page(&[1], Some("t"))
            } else {
                Err(api(410, None))
            }
        },
        |_| ControlFlow::Continue(()),
    );
    assert_eq!(r.unwrap_err().status(), Some(410));
    // A visit that breaks ends the list: no more items, no more pages.
    let mut calls = 0;
    let mut seen = Vec::new();
    let r = page_through(
        500,
        |_, _| {
            calls += 1;
            page(&[1, 2, 3], Some("t"))
        },
        |v| {
            seen.push(v.as_i64().unwrap());
            if seen.len() == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        },
    );
    assert!(r.is_ok());
    assert_eq!((calls, seen), (1, vec![1, 2]));
    // A page over the read limit is asked again at half the size, from the
    // same place, and the rest of the list comes in pages that size; a
    // single item over the limit is an error.
    let mut asked = Vec::new();
    let mut seen = Vec::new();
    let r = page_through(
        500,
        |t, limit| {
            asked.push((t.map(str::to_owned), limit));
            match (t, limit) {
                (_, 126..) => Err(Error::TooLarge(MAX_BODY)),
                (None, _) => page(&[1], Some("t")),
                (Some(_), _) => page(&[2], None),
            }
        },
        |v| {
            seen.push(v.as_i64().unwrap());
            ControlFlow::Continue(())
        },
    );
    assert!(r.is_ok());
    let t = Some("t".to_owned());
    assert_eq!(
        asked,
        [(None, 500), (None, 250), (None, 125), (t.clone(), 125)]
    );
    assert_eq!(seen, [1, 2]);
    let mut asked = Vec::new();
    let r = page_through(
        4,
        |_, limit| {
            asked.push(limit);
            Err::<(Vec<serde_json::Value>, _), _>(Error::TooLarge(MAX_BODY))
        },
        |_| ControlFlow::Continue(()),
    );
    assert!(matches!(r, Err(Error::TooLarge(_))));
    assert_eq!(asked, [4, 2, 1]);
}

/// Serves one canned HTTP answer on loopback; returns its base URL.
/// A client of a server that gives one connection `answer`.
fn one_answer(answer: Vec<u8>) -> Client {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        use std::io::Write;
        let (mut conn, _) = listener.accept().unwrap();
        let mut head = [0u8; 4096];
        let _ = conn.read(&mut head);
        let _ = conn.write_all(&answer);
    });
    Client::new(KubeConfig {
        server: url,
        ca_pem: None,
        auth: Auth::None,
        namespace: None,
    })
    .unwrap()
}

#[test]
fn a_long_error_body_keeps_its_status() {
    let page = "x".repeat(200 * 1024);
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
        page.len()
    );
    let client = one_answer(answer.into_bytes());
    let err = client
        .send_with::<Value>(&client.agent, &Method::GET, "/api", None, None)
        .unwrap_err();
    assert_eq!(err.status(), Some(503), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("xxxx") && message.len() < 1024,
        "{message}"
    );
}

/// A 200 answer whose JSON body (a list of one string) is `n` bytes.
fn answer_of(n: usize) -> Vec<u8> {
    let mut answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n[\""
    )
    .into_bytes();
    answer.resize(answer.len() + n - 3, b'x');
    answer.extend_from_slice(b"\"]");
    answer
}

#[test]
fn a_body_over_the_limit_is_refused_not_retried() {
    let client = one_answer(answer_of(MAX_BODY as usize + 1024));
    let err = client
        .send_with::<Value>(
            &client.agent,
            &Method::GET,
            "/api/v1/configmaps",
            None,
            None,
        )
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge(MAX_BODY)), "{err}");
    assert!(!err.is_transient(), "a retry would read it again");
    assert_eq!(
        err.to_string(),
        "kubernetes api: response body over the 8 MiB limit"
    );
    // A page of a list has a quarter of it.
    let client = one_answer(answer_of(MAX_PAGE_BODY as usize + 1024));
    let page = "/api/v1/configmaps?limit=500&labelSelector=a";
    let err = client
        .send_with::<Value>(&client.agent, &Method::GET, page, None, None)
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge(MAX_PAGE_BODY)), "{err}");
    assert_eq!(
        read_limit(&Method::GET, "/api/v1/configmaps/limit"),
        MAX_BODY
    );
    assert_eq!(
        read_limit(&Method::GET, "/api/v1/x?watch=1&limit=1"),
        MAX_BODY
    );
}

#[test]
fn query_encodes_selectors_and_tokens() {
    let q = Query::new()
        .param(
            "labelSelector",
            "app.kubernetes.io/managed-by=nexo-manager,a!=b",
        )
        .param("continue", "eyJ2Ijoi+/=")
        .finish();
    assert_eq!(
        q,
        "?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dnexo-manager%2Ca%21%3Db&continue=eyJ2Ijoi%2B%2F%3D"
    );
    assert_eq!(Query::new().finish(), "");
}

/// A fence that holds or not.
struct Gate(bool);

impl Fence for Gate {
    fn may_write(&self, _method: &Method, _path: &str) -> bool {
        self.0
    }
}

#[test]
fn a_fence_that_does_not_hold_stops_every_write_before_it_is_sent() {
    let answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}".to_vec();
    // Closed: nothing is sent, whatever the method but GET.
    let client = one_answer(answer.clone()).with_fence(Rc::new(Gate(false)));
    for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
        let err = client
            .request_as::<Value>(method.clone(), "/api/v1/namespaces/x/configmaps", None)
            .unwrap_err();
        assert!(matches!(err, Error::Fenced), "{method}: {err}");
        assert!(err.to_string().contains("fenced"), "{err}");
    }
    assert!(matches!(
        client.request_quick(Method::PUT, "/x", None),
        Err(Error::Fenced)
    ));
    // A read still goes out (and gets the one answer).
    assert!(
        client
            .request_as::<Value>(Method::GET, "/api", None)
            .is_ok()
    );
    // Open: the write goes out.
    let client = one_answer(answer).with_fence(Rc::new(Gate(true)));
    assert!(
        client
            .request_as::<Value>(Method::POST, "/api", None)
            .is_ok()
    );
}

#[test]
fn the_executor_sends_writes_as_the_namespaces_service_account_and_reads_as_itself() {
    let manager = Client::new(KubeConfig {
        server: "http://127.0.0.1:1".into(),
        ca_pem: None,
        auth: Auth::None,
        namespace: None,
    })
    .unwrap();
    let executor = manager.executor("nexo-executor");
    let cm = "/api/v1/namespaces/shop/configmaps/x?fieldManager=nexo-manager";
    assert_eq!(
        executor.acting_as(&Method::PATCH, cm).unwrap().as_deref(),
        Some("system:serviceaccount:shop:nexo-executor")
    );
    assert_eq!(
        executor
            .acting_as(
                &Method::POST,
                "/apis/nexo.io/v1alpha1/namespaces/billing/nexoproxies"
            )
            .unwrap()
            .as_deref(),
        Some("system:serviceaccount:billing:nexo-executor")
    );
    assert_eq!(executor.acting_as(&Method::GET, cm).unwrap(), None);
    assert_eq!(manager.acting_as(&Method::PATCH, cm).unwrap(), None);
    // A write outside a namespace is never sent, as anyone.
    for path in [
        "/api/v1/nodes/n1",
        "/api/v1/namespaces/",
        "/apis/x/v1/things?namespaces=a",
    ] {
        let e = executor.acting_as(&Method::DELETE, path).unwrap_err();
        assert!(e.to_string().contains("names no namespace"), "{path}: {e}");
    }
}

/// A 200 answer whose JSON body is `body`.
fn json_answer(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn a_list_page_is_decoded_item_by_item_and_an_item_not_understood_ends_it() {
    #[derive(serde::Deserialize)]
    struct Named {
        metadata: NamedMeta,
    }
    #[derive(serde::Deserialize)]
    struct NamedMeta {
        name: String,
    }
    let page = r#"{"kind": "List", "metadata": {"resourceVersion": "7"}, "items": [
        {"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}"#;
    let client = one_answer(json_answer(page));
    let mut seen = Vec::new();
    client
        .list_each_as("/api/v1/namespaces/x/configmaps", None, 500, |n: Named| {
            seen.push(n.metadata.name)
        })
        .unwrap();
    assert_eq!(seen, ["a", "b"]);
    // The second item has no name: the first was visited, then the list
    // ends with the item's error.
    let page = r#"{"metadata": {}, "items": [{"metadata": {"name": "a"}}, {"metadata": {}},
        {"metadata": {"name": "c"}}]}"#;
    let client = one_answer(json_answer(page));
    let mut seen = Vec::new();
    let err = client
        .list_each_as("/api/v1/namespaces/x/configmaps", None, 500, |n: Named| {
            seen.push(n.metadata.name)
        })
        .unwrap_err();
    assert_eq!(seen, ["a"]);
    assert!(
        err.to_string()
            .starts_with("kubernetes api: bad list item: missing field `name`"),
        "{err}"
    );
    // `"items": null` (an empty `PartialObjectMetadataList`): none.
    let client = one_answer(json_answer(r#"{"metadata": {}, "items": null}"#));
    let mut count = 0;
    client
        .list_each_as("/api/v1/namespaces/x/configmaps", None, 500, |_: Value| {
            count += 1
        })
        .unwrap();
    assert_eq!(count, 0);
}

/// A server answering each connection with the next of `answers`, and the
/// request lines it was sent.
fn answers(answers: Vec<Vec<u8>>) -> (Client, std::sync::mpsc::Receiver<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Write;
        for answer in answers {
            let (mut conn, _) = listener.accept().unwrap();
            let mut head = [0u8; 4096];
            let n = conn.read(&mut head).unwrap_or(0);
            let line = String::from_utf8_lossy(&head[..n]);
            let _ = tx.send(line.lines().next().unwrap_or_default().to_owned());
            let _ = conn.write_all(&answer);
        }
    });
    let client = Client::new(KubeConfig {
        server: url,
        ca_pem: None,
        auth: Auth::None,
        namespace: None,
    })
    .unwrap();
    (client, rx)
}

#[test]
fn a_listing_reads_a_page_at_a_time_as_taken_and_ends_at_an_expired_page() {
    let first = r#"{"metadata": {"continue": "next-1"}, "items": [
        {"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}"#;
    let second = r#"{"metadata": {"continue": ""}, "items": [{"metadata": {"name": "c"}}]}"#;
    let (client, requests) = answers(vec![json_answer(first), json_answer(second)]);
    let mut listing = client.listing("/api/v1/namespaces/x/configmaps", Some("a=b"), 2);
    let name = |v: Option<Result<Value, Error>>| v.unwrap().unwrap()["metadata"]["name"].clone();
    assert_eq!(name(listing.next()), "a");
    let line = requests.recv().unwrap();
    assert!(
        line.contains("limit=2") && line.contains("labelSelector=a%3Db"),
        "{line}"
    );
    assert!(!line.contains("continue"), "{line}");
    assert_eq!(name(listing.next()), "b");
    // Nothing asked before the first page is used up.
    assert!(requests.try_recv().is_err());
    assert_eq!(name(listing.next()), "c");
    assert!(requests.recv().unwrap().contains("continue=next-1"));
    assert!(listing.next().is_none());
    assert!(listing.next().is_none());

    // An expired continue token ends it with its error, never restarted.
    let gone = r#"{"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410}"#;
    let gone = format!(
        "HTTP/1.1 410 Gone\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{gone}",
        gone.len()
    );
    let (client, _requests) = answers(vec![json_answer(first), gone.into_bytes()]);
    let mut listing = client.listing("/api/v1/namespaces/x/configmaps", None, 2);
    assert_eq!(name(listing.next()), "a");
    assert_eq!(name(listing.next()), "b");
    let err = listing.next().unwrap().unwrap_err();
    assert!(err.is_gone(), "{err}");
    assert!(listing.next().is_none());
}

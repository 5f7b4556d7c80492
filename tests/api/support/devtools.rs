//! A DevTools-protocol client over a hand-made WebSocket: what chromedriver
//! cannot do (input events at exact places and times).

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::webdriver::{Browser, WAIT};

/// A DevTools-protocol connection straight to one page of a browser (a
/// WebSocket to the port Chromium wrote into its profile), for what
/// chromedriver cannot do.
pub struct DevTools {
    socket: tokio::net::TcpStream,
    next_id: u64,
}

impl DevTools {
    /// Connects to the browser's page whose URL is `url`.
    pub async fn connect(browser: &Browser, url: &str) -> Self {
        let active = std::fs::read_to_string(browser.profile().join("DevToolsActivePort"))
            .expect("Chromium wrote its DevTools port");
        let port: u16 = active.lines().next().unwrap().parse().unwrap();
        let targets: Value = reqwest::get(format!("http://127.0.0.1:{port}/json/list"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let target = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page" && t["url"] == url)
            .unwrap_or_else(|| panic!("no page at {url}: {targets:#}"));
        let socket_url = target["webSocketDebuggerUrl"].as_str().unwrap();
        let path = socket_url
            .strip_prefix(&format!("ws://127.0.0.1:{port}"))
            .unwrap_or_else(|| panic!("an unexpected DevTools address: {socket_url}"));
        let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        socket
            .write_all(
                format!(
                    "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
                     Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                     Sec-WebSocket-Version: 13\r\n\r\n"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(socket.read_u8().await.unwrap());
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        Self { socket, next_id: 1 }
    }

    /// Calls a method and returns its result.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"id": id, "method": method, "params": params}).to_string();
        // A client's frames are masked; one final text frame.
        let mask = [0x6f, 0x6e, 0x65, 0x6a];
        let mut frame = vec![0x81];
        match message.len() {
            len if len < 126 => frame.push(0x80 | len as u8),
            len if len <= 0xffff => {
                frame.push(0x80 | 126);
                frame.extend((len as u16).to_be_bytes());
            }
            len => {
                frame.push(0x80 | 127);
                frame.extend((len as u64).to_be_bytes());
            }
        }
        frame.extend(mask);
        frame.extend(message.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.socket.write_all(&frame).await.unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let reply = tokio::time::timeout_at(deadline, self.read_message())
                .await
                .unwrap_or_else(|_| panic!("DevTools did not answer {method} in {WAIT:?}"));
            let reply: Value = serde_json::from_str(&reply).unwrap();
            if reply["id"] == id {
                assert!(reply["error"].is_null(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    /// Reads one whole message (text), skipping control frames.
    async fn read_message(&mut self) -> String {
        let mut message = Vec::new();
        loop {
            let first = self.socket.read_u8().await.unwrap();
            let second = self.socket.read_u8().await.unwrap();
            let len = match second & 0x7f {
                126 => u64::from(self.socket.read_u16().await.unwrap()),
                127 => self.socket.read_u64().await.unwrap(),
                len => u64::from(len),
            };
            let mut mask = [0u8; 4];
            if second & 0x80 != 0 {
                self.socket.read_exact(&mut mask).await.unwrap();
            }
            let mut payload = vec![0u8; len as usize];
            self.socket.read_exact(&mut payload).await.unwrap();
            if second & 0x80 != 0 {
                for (i, byte) in payload.iter_mut().enumerate() {
                    *byte ^= mask[i % 4];
                }
            }
            match first & 0x0f {
                0x8 => panic!("DevTools closed the connection"),
                0x9 | 0xa => continue,
                _ => message.extend(payload),
            }
            if first & 0x80 != 0 {
                return String::from_utf8(message).unwrap();
            }
        }
    }

    /// A left click at (`x`, `y`) (CSS pixels of the viewport): the pointer
    /// moves there, presses and releases; `count` is the click's place in a
    /// multi-click (2 for the second click of a double click).
    pub async fn click(&mut self, x: f64, y: f64, count: u32) {
        for (kind, buttons) in [("mouseMoved", 0), ("mousePressed", 1), ("mouseReleased", 0)] {
            let mut params = json!({"type": kind, "x": x, "y": y, "buttons": buttons});
            if kind != "mouseMoved" {
                params["button"] = json!("left");
                params["clickCount"] = json!(count);
            }
            self.call("Input.dispatchMouseEvent", params).await;
        }
    }
}

// What the server counted and stored.

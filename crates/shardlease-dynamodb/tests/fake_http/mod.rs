//! The part of a fake DynamoDB endpoint on loopback that every such test needs: reading one
//! HTTP request head off the connection. Each test answers the calls its own way.

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Reads until a full request head is buffered: (head length, body length, X-Amz-Target).
pub async fn read_head(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(usize, usize, String)> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let header = |name: &str| {
                head.lines()
                    .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
                    .unwrap_or_default()
            };
            let len = header("content-length:").parse().unwrap_or(0);
            return Some((end + 4, len, header("x-amz-target:")));
        }
        let mut chunk = [0u8; 4096];
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

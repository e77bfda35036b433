//! Pages of a list RPC's answer (`page_size`, `page_token`,
//! `next_page_token`), one rule for every service: the token is the offset
//! of the page's first item, in the list's own stable order; a page size of
//! 0 answers every item (what a caller from before paging asked).

/// Why a page cannot be answered: the caller's `page_token`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "page_token {0:?} is not a token this service gave (a list's next_page_token): start from the first page"
)]
pub struct BadPageToken(pub String);

impl From<BadPageToken> for tonic::Status {
    fn from(error: BadPageToken) -> Self {
        tonic::Status::invalid_argument(error.to_string())
    }
}

/// Where the page `token` starts (0 for none): what a gateway checks
/// before it asks a service.
pub fn start(token: &str) -> Result<usize, BadPageToken> {
    match token {
        "" => Ok(0),
        token if token.len() <= 9 && token.bytes().all(|b| b.is_ascii_digit()) => {
            token.parse::<usize>().map_err(|_| BadPageToken(token.into()))
        }
        token => Err(BadPageToken(token.chars().take(64).collect())),
    }
}

/// The page of `items` that `page_size` and `page_token` ask for, and the
/// token of the next page (empty after the last).
pub fn page<T>(items: Vec<T>, page_size: u32, page_token: &str) -> Result<(Vec<T>, String), BadPageToken> {
    let start = start(page_token)?;
    let total = items.len();
    let size = if page_size == 0 { total.max(1) } else { page_size as usize };
    let page: Vec<T> = items.into_iter().skip(start).take(size).collect();
    let next = if start + size < total { (start + size).to_string() } else { String::new() };
    Ok((page, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_of_one_walk_the_list_once_in_order_and_size_zero_answers_all() {
        let items: Vec<u32> = (0..3).collect();
        let (mut seen, mut token) = (Vec::new(), String::new());
        loop {
            let (page, next) = page(items.clone(), 1, &token).unwrap();
            assert!(page.len() <= 1);
            seen.extend(page);
            if next.is_empty() {
                break;
            }
            token = next;
        }
        assert_eq!(seen, items);
        assert_eq!(page(items.clone(), 0, "").unwrap(), (items.clone(), String::new()));
        assert_eq!(page(items.clone(), 2, "2").unwrap(), (vec![2], String::new()));
        assert!(page(items, 1, "b2Zmc2V0OjE").is_err());
    }
}

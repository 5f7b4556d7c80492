//! Pages of a long list (the unknown queue, the staff's job search, a
//! user's jobs): each is read one row longer than it shows, and that extra
//! row says whether a next page follows; the next page starts after the
//! last row shown, named in its link.

use super::PageError;

/// A page of at most `per_page` rows.
#[derive(Debug, Clone, Copy)]
pub struct Paging {
    pub per_page: i64,
}

impl Paging {
    /// How many rows to read: one more than a page.
    pub fn fetch(self) -> i64 {
        self.per_page + 1
    }

    /// Rows read with [`Paging::fetch`] cut to one page, and the link to
    /// the next page (`next_link` of the last row shown) when more follow.
    pub fn cut<T>(
        self,
        mut rows: Vec<T>,
        next_link: impl FnOnce(&T) -> String,
    ) -> (Vec<T>, Option<String>) {
        let more = rows.len() as i64 > self.per_page;
        rows.truncate(self.per_page as usize);
        let next = if more {
            rows.last().map(next_link)
        } else {
            None
        };
        (rows, next)
    }
}

/// The row a page link starts after (its `after=` or `before=`), if it
/// names one; a link that names something else is refused.
pub fn cursor<T>(
    raw: Option<&str>,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<Option<T>, PageError> {
    raw.map(|raw| parse(raw).ok_or_else(|| PageError::bad_request("That page link is not valid.")))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_cut_and_links_on_only_when_more_rows_follow() {
        let paging = Paging { per_page: 2 };
        assert_eq!(paging.fetch(), 3);
        let link = |n: &i32| format!("?after={n}");
        assert_eq!(
            paging.cut(vec![1, 2, 3], link),
            (vec![1, 2], Some("?after=2".into()))
        );
        assert_eq!(paging.cut(vec![1, 2], link), (vec![1, 2], None));
        assert_eq!(paging.cut(Vec::new(), link), (vec![], None));
    }

    #[test]
    fn a_page_link_naming_no_row_is_refused() {
        let parse = |raw: &str| raw.parse::<u8>().ok();
        assert_eq!(cursor(None, parse).unwrap(), None);
        assert_eq!(cursor(Some("7"), parse).unwrap(), Some(7));
        assert!(cursor(Some("x"), parse).is_err());
    }
}

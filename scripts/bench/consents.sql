-- The consent CSV of the import benchmark, written to stdout: :consents rows with the İYS header
-- recipient,type,recipient_type,status,source,consent_date. Row k (1-based):
--   k <= :customers, on the phone of customer k (+90532XXXXXXX, see customers.sql):
--     k % 4 <> 0  MESAJ BIREYSEL ONAY   (75% of those customers: the launch's eligible recipients)
--     k % 8 =  0  MESAJ BIREYSEL RET    (12.5%: excluded for RET)
--     k % 8 =  4  MESAJ TACIR    ONAY   (12.5%: a merchant consent, which does not cover an individual: no consent)
--   k >  :customers: EPOSTA BIREYSEL on musteri<j>@example.com (j = k - :customers), RET when j % 5 = 0.
-- Consent dates are spread over 2023-2024 (Turkey has no DST then, so every time exists in Europe/Istanbul).
-- Run with: psql -v customers=N -v consents=M -f consents.sql > consents.csv
COPY (
    SELECT CASE WHEN k <= :customers THEN '+90' || (5320000000 + k)::text
                ELSE 'musteri' || (k - :customers)::text || '@example.com' END AS recipient,
           CASE WHEN k <= :customers THEN 'MESAJ' ELSE 'EPOSTA' END AS type,
           CASE WHEN k <= :customers AND k % 8 = 4 THEN 'TACIR' ELSE 'BIREYSEL' END AS recipient_type,
           CASE WHEN k <= :customers THEN CASE WHEN k % 8 = 0 THEN 'RET' ELSE 'ONAY' END
                ELSE CASE WHEN (k - :customers) % 5 = 0 THEN 'RET' ELSE 'ONAY' END END AS status,
           (ARRAY['HS_WEB', 'HS_MOBIL', 'HS_FIZIKSEL_ORTAM', 'HS_CAGRI_MERKEZI', 'HS_ISLAK_IMZA'])[1 + k % 5] AS source,
           to_char(timestamp '2023-01-01 00:00:00' + (k::bigint * 7919 % 63072000) * interval '1 second',
                   'YYYY-MM-DD HH24:MI:SS') AS consent_date
    FROM generate_series(1, :consents) AS k
) TO STDOUT WITH (FORMAT csv, HEADER true);

-- The launch benchmark's audience table: :customers rows, user k (1-based) with user_id 'c' || k zero-padded
-- to 8 digits, the Turkish mobile +90 532 000 00 00 + k written in one of four spellings by k % 4 (the
-- planner normalises them all to +90532XXXXXXX), and a Turkish first name (ç ğ ı İ ş make the SMS UCS-2).
-- Run with: psql -v customers=N -f customers.sql
SET client_min_messages = warning;
DROP TABLE IF EXISTS customers;
CREATE TABLE customers (
    user_id     text PRIMARY KEY,
    phone       text NOT NULL,
    first_name  text NOT NULL
);
INSERT INTO customers (user_id, phone, first_name)
SELECT 'c' || lpad(k::text, 8, '0'),
       CASE k % 4
           WHEN 0 THEN '0' || substr(n, 1, 3) || ' ' || substr(n, 4, 3) || ' ' || substr(n, 7, 2) || ' ' || substr(n, 9, 2)
           WHEN 1 THEN '+90' || n
           WHEN 2 THEN n
           ELSE '+90 (' || substr(n, 1, 3) || ') ' || substr(n, 4, 3) || '-' || substr(n, 7, 2) || '-' || substr(n, 9, 2)
       END,
       (ARRAY['Ayşe', 'Mehmet', 'Zeynep', 'Mustafa', 'Elif', 'Ahmet', 'Şükrü', 'Gülşen', 'İbrahim', 'Çağrı'])[1 + k % 10]
FROM generate_series(1, :customers) AS k
CROSS JOIN LATERAL (SELECT (5320000000 + k)::text AS n) AS p;
-- Audience queries run as the audience role, which reads only what it is granted (migration 0008).
GRANT SELECT ON customers TO campaignctl_audience;
ANALYZE customers;

-- The launch benchmark's audience: every customer, with the column the message uses.
SELECT user_id, phone, first_name
FROM customers
ORDER BY user_id
